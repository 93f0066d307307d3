//! [`LockRegistry`] and [`Lock`]: handles by key and their per-key state. The options are in
//! `options.rs`, the handle cache in `cache.rs`, the path of an acquisition in `acquire.rs`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::Wait;
use crate::backend::{Backend, LockInfo, LockKind, LockName, Owner};
use crate::background::Background;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::multi::MultiLock;
use crate::renewal::{Hold, Renewer};

mod cache;
mod options;

use self::cache::{CachedSlot, Slots};
pub(crate) use self::options::check_lease;
pub use self::options::{RegistryOptions, MAX_LEASE, MIN_LEASE};

/// Hands out [`Lock`] handles by key over one backend.
///
/// A registry is cheap to clone (all clones share the handle cache, the local locks and the
/// renewal task). Within one registry only one task at a time contends remotely for a key: the
/// others wait in a local FIFO queue, and a remote hold may pass directly to the next local
/// waiter (at most `max_local_handoffs` times in a row).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use distlock::{LockRegistry, backends::memory::MemoryBackend};
/// let registry = LockRegistry::new(MemoryBackend::new());
/// let lock = registry.obtain("voucher:42")?;
/// let guard = lock.lock().await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockRegistry {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) opts: RegistryOptions,
    prefix: Arc<str>,
    slots: Mutex<Slots>,
    pub(crate) renewer: Arc<Renewer>,
    pub(crate) background: Background,
    epoch: Instant,
}

impl fmt::Debug for LockRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRegistry")
            .field("backend", &self.inner.backend)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

/// Per-key state shared by all handles and guards of one key in one registry.
pub(crate) struct Slot {
    pub(crate) name: LockName,
    pub(crate) last_used_ms: AtomicU64,
    /// Made by the first acquisition (or use of the blocking facade): most cached handles are
    /// only obtained, and then cost no local lock.
    local: OnceLock<Box<LocalLock>>,
}

/// The local lock of a key and what goes with it.
pub(crate) struct LocalLock {
    pub(crate) state: Arc<tokio::sync::Mutex<SlotState>>,
    pub(crate) waiters: AtomicUsize,
    /// The holds threads took through the blocking facade, which is reentrant per thread: at
    /// most one for an exclusive kind, one per thread for the shared ones.
    pub(crate) thread_holds: Mutex<Vec<ThreadHold>>,
    /// Read locks only: the remote read hold that local readers join (see `ReadGroup`).
    pub(crate) readers: Mutex<Option<Arc<ReadGroup>>>,
}

/// A remote read hold shared by the local readers of one registry: a reader that finds one
/// worth joining takes part in it with no round trip; the last one to leave releases it. It
/// takes at most `max_local_handoffs` joiners, so that a stream of local readers cannot keep
/// it (and a writer waiting for the key elsewhere) going for ever.
pub(crate) struct ReadGroup {
    pub(crate) hold: Arc<Hold>,
    /// The local guards taking part; 0 once the last one left (nobody may join then).
    readers: Mutex<u32>,
}

impl ReadGroup {
    pub(crate) fn new(hold: Arc<Hold>) -> Self {
        ReadGroup {
            hold,
            readers: Mutex::new(1),
        }
    }

    fn readers(&self) -> std::sync::MutexGuard<'_, u32> {
        self.readers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins when the group still has readers, enough lease left and joins to spare; returns
    /// the joiner's local sequence number.
    pub(crate) fn join(&self, max_joins: u32) -> Option<u32> {
        let mut n = self.readers();
        if *n == 0
            || self.hold.local_seq.load(Ordering::Acquire) >= max_joins
            || !crate::acquire::worth_handing_off(&self.hold)
        {
            return None;
        }
        *n += 1;
        Some(self.hold.local_seq.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// Leaves; true for the last reader, who must release the hold.
    pub(crate) fn leave(&self) -> bool {
        let mut n = self.readers();
        *n = n.saturating_sub(1);
        *n == 0
    }
}

/// A hold taken by one thread (the blocking facade's reentrant lock): the owner thread, how
/// often it locked without unlocking, and the guard.
pub(crate) struct ThreadHold {
    pub(crate) thread: std::thread::ThreadId,
    pub(crate) count: u32,
    pub(crate) guard: LockGuard,
}

/// What the local lock protects: the remote hold that may pass between local guards.
#[derive(Default)]
pub(crate) struct SlotState {
    pub(crate) hold: Option<Arc<Hold>>,
    /// Until then this registry lets remote waiters go first (see `contended_release_grace`).
    pub(crate) yield_until: Option<Instant>,
    /// The last acquisition had to wait for another holder.
    pub(crate) contended: bool,
}

impl LockRegistry {
    /// A registry over `backend` with default options.
    pub fn new(backend: impl Backend) -> Self {
        Self::from_backend(Arc::new(backend), RegistryOptions::default())
            .expect("default options are valid")
    }

    /// A registry over `backend` with `options`; fails on invalid options.
    pub fn with_options(backend: impl Backend, options: RegistryOptions) -> Result<Self> {
        Self::from_backend(Arc::new(backend), options)
    }

    /// A registry over a shared backend.
    pub fn from_backend(backend: Arc<dyn Backend>, mut options: RegistryOptions) -> Result<Self> {
        options.validate()?;
        match backend.longest_lease() {
            Some(max) if !options.lease_explicit && max < options.lease && max >= MIN_LEASE => {
                tracing::info!(lease = ?max, default = ?options.lease, "no lease given: using the longest the backend grants");
                options.lease = max;
            }
            _ => {}
        }
        let renewer = Arc::new(Renewer::new(backend.clone(), options.renew));
        let evict_at = options.max_cached_locks;
        Ok(LockRegistry {
            inner: Arc::new(Inner {
                prefix: Arc::from(options.prefix.as_str()),
                backend,
                opts: options,
                slots: Mutex::new(Slots {
                    by_key: HashSet::new(),
                    others: HashMap::new(),
                    evict_at,
                }),
                renewer,
                background: Background::default(),
                epoch: Instant::now(),
            }),
        })
    }

    /// Connects to the backend named by `url` (see [`crate::connect`]) and builds a registry.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect(url: &str, options: RegistryOptions) -> Result<Self> {
        Self::from_backend(crate::connect::connect(url).await?, options)
    }

    /// The lock handle for `key`: a mutex. Cheap: handles are cached, and all handles of one
    /// key in one registry share one local lock. Fails only on an invalid key.
    pub fn obtain(&self, key: &str) -> Result<Lock> {
        let inner = &self.inner;
        let mut slots = inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match slots.by_key.get(key) {
            Some(s) => s.0.clone(),
            None => {
                let name = LockName::new(inner.prefix.clone(), key)?;
                if slots.len() >= slots.evict_at {
                    slots.evict_idle(inner.opts.max_cached_locks);
                }
                let slot = Slot::new(name);
                slots.by_key.insert(CachedSlot(slot.clone()));
                slot
            }
        };
        drop(slots);
        Ok(self.handle(slot))
    }

    /// The read-write lock of `key`: [`read`](ReadWriteLock::read) holds are shared with other
    /// readers, [`write`](ReadWriteLock::write) holds exclude everybody, and both exclude the
    /// mutex of the same key ([`obtain`](Self::obtain)), as `flock -s` and `flock -x` do. A
    /// writer that waits keeps new readers out, so readers cannot starve it.
    ///
    /// Within this registry, readers share one remote hold: a reader that comes while others
    /// read joins their hold with no round trip (at most `max_local_handoffs` joiners per
    /// remote hold, so that writers elsewhere get their turn).
    ///
    /// Fails on an invalid key, and with [`Error::Unsupported`] when the backend has no
    /// read-write locks ([`Capabilities::read_write`](crate::Capabilities)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// use distlock::{LockRegistry, backends::memory::MemoryBackend};
    /// let registry = LockRegistry::new(MemoryBackend::new());
    /// let config = registry.read_write("config")?;
    /// let a = config.read().lock().await?;
    /// let b = config.read().lock().await?; // readers share the key
    /// assert!(config.write().try_lock().await.is_err()); // a writer waits for them
    /// a.release().await?;
    /// b.release().await?;
    /// let w = config.write().try_lock().await?;
    /// w.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn read_write(&self, key: &str) -> Result<ReadWriteLock> {
        Ok(ReadWriteLock {
            read: self.obtain_kind(key, LockKind::Read)?,
            write: self.obtain_kind(key, LockKind::Write)?,
        })
    }

    /// The semaphore `key` with `permits` permits: each [`lock`](Lock::lock) (or `try_lock`,
    /// `try_lock_for`) takes one permit, with a lease, owner token and renewal of its own, so
    /// that a crashed holder's permit comes back after its lease. At most `permits` guards of
    /// the key are held at once across all processes. Every holder must agree on `permits`;
    /// a backend that sees a disagreement refuses with [`Error::InvalidConfig`].
    ///
    /// Fails on an invalid key, with [`Error::InvalidConfig`] for 0 or more than
    /// [`MAX_PERMITS`](crate::MAX_PERMITS) permits, and with [`Error::Unsupported`] when the
    /// backend has no semaphores ([`Capabilities::semaphores`](crate::Capabilities)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// use distlock::{LockRegistry, backends::memory::MemoryBackend};
    /// let registry = LockRegistry::new(MemoryBackend::new());
    /// let pool = registry.semaphore("db-connections", 2)?;
    /// let first = pool.lock().await?;
    /// let second = pool.lock().await?;
    /// assert!(pool.try_lock().await.is_err()); // both permits are taken
    /// first.release().await?;
    /// let third = pool.try_lock().await?;
    /// # drop((second, third));
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, key: &str, permits: u32) -> Result<Lock> {
        self.obtain_kind(key, LockKind::semaphore(permits)?)
    }

    /// A multi-key lock over the mutexes of `keys`: held all together or not at all (see
    /// [`MultiLock`]). Fails on an invalid or repeated key, or an empty list.
    pub fn multi<K: AsRef<str>>(&self, keys: &[K]) -> Result<MultiLock> {
        let locks = keys
            .iter()
            .map(|k| self.obtain(k.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        MultiLock::new(locks)
    }

    /// The handle of `key` for holds of `kind`.
    pub(crate) fn obtain_kind(&self, key: &str, kind: LockKind) -> Result<Lock> {
        if kind == LockKind::Mutex {
            return self.obtain(key);
        }
        let inner = &self.inner;
        if !inner.backend.capabilities().supports(kind) {
            return Err(Error::Unsupported {
                backend: inner.backend.kind(),
                what: format!("{} locks", kind.name()),
            });
        }
        let name = LockName::new(inner.prefix.clone(), key)?.with_kind(kind);
        Ok(self.obtain_other(name))
    }

    /// The handle of the election `key` (see [`LockName::for_election`]): a slot of its own,
    /// apart from the key's mutex, as the backend may keep them apart.
    pub(crate) fn obtain_election(&self, key: &str) -> Result<Lock> {
        let name = LockName::new(self.inner.prefix.clone(), key)?.for_election();
        Ok(self.obtain_other(name))
    }

    /// The cached handle of a name that is not a plain mutex.
    fn obtain_other(&self, name: LockName) -> Lock {
        let inner = &self.inner;
        let mut slots = inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        let at = (name.clone(), name.is_election());
        let slot = match slots.others.get(&at) {
            Some(s) => s.clone(),
            None => {
                if slots.len() >= slots.evict_at {
                    slots.evict_idle(inner.opts.max_cached_locks);
                }
                let slot = Slot::new(name);
                slots.others.insert(at, slot.clone());
                slot
            }
        };
        drop(slots);
        self.handle(slot)
    }

    fn handle(&self, slot: Arc<Slot>) -> Lock {
        let inner = &self.inner;
        slot.last_used_ms.store(inner.now_ms(), Ordering::Relaxed);
        Lock {
            slot,
            registry: inner.clone(),
            lease: inner.opts.lease,
            owner: inner.opts.owner.clone(),
            at_least: None,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// The options.
    pub fn options(&self) -> &RegistryOptions {
        &self.inner.opts
    }
}

impl Inner {
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn max_poll(&self) -> Duration {
        self.opts.max_poll_interval.unwrap_or_else(|| {
            if self.backend.capabilities().notifies_release {
                Duration::from_millis(500)
            } else {
                Duration::from_millis(50)
            }
        })
    }
}

impl Slot {
    fn new(name: LockName) -> Arc<Self> {
        Arc::new(Slot {
            name,
            last_used_ms: AtomicU64::new(0),
            local: OnceLock::new(),
        })
    }

    /// The local lock, made on first use.
    pub(crate) fn local(&self) -> &LocalLock {
        self.local.get_or_init(|| {
            Box::new(LocalLock {
                state: Arc::new(tokio::sync::Mutex::new(SlotState::default())),
                waiters: AtomicUsize::new(0),
                thread_holds: Mutex::new(Vec::new()),
                readers: Mutex::new(None),
            })
        })
    }

    /// The remote read hold local readers may join (read locks only).
    pub(crate) fn readers(&self) -> std::sync::MutexGuard<'_, Option<Arc<ReadGroup>>> {
        self.local()
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// How many local tasks wait for the local lock.
    pub(crate) fn waiters(&self) -> &AtomicUsize {
        &self.local().waiters
    }

    /// Only the cache refers to it and nobody holds or waits for it.
    fn is_idle(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1
            && self.local.get().is_none_or(|l| {
                l.waiters.load(Ordering::SeqCst) == 0
                    && l.state
                        .try_lock()
                        .map(|s| s.hold.is_none())
                        .unwrap_or(false)
                    && l.readers.lock().map(|r| r.is_none()).unwrap_or(false)
            })
    }

    /// Releases a remote hold left for a local waiter who then gave up. Called by whoever saw
    /// the last waiter leave; the double check (waiter count, then the local lock) means that
    /// of the leaving waiter and the handing-off guard at least one finds it.
    pub(crate) fn release_orphaned_hold(self: &Arc<Self>, registry: &Inner) {
        let local = self.local();
        if local.waiters.load(Ordering::SeqCst) != 0 {
            return;
        }
        if let Ok(mut state) = local.state.clone().try_lock_owned() {
            if let Some(hold) = state.hold.take() {
                registry.renewer.deregister(&hold);
                registry.release_in_background(hold.name.clone(), hold.token);
            }
        }
    }
}

/// A handle on one key of a [`LockRegistry`]. Cheap to clone; all handles of a key share one
/// local lock.
#[derive(Clone)]
pub struct Lock {
    pub(crate) slot: Arc<Slot>,
    pub(crate) registry: Arc<Inner>,
    pub(crate) lease: Duration,
    pub(crate) owner: Owner,
    pub(crate) at_least: Option<Duration>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.slot.name)
            .field("lease", &self.lease)
            .field("owner", &self.owner)
            .finish()
    }
}

impl Lock {
    /// The key.
    pub fn key(&self) -> &str {
        self.slot.name.key()
    }

    /// The kind of the holds taken through this handle: [`LockKind::Mutex`] from
    /// [`LockRegistry::obtain`], [`LockKind::Read`] or [`LockKind::Write`] from a
    /// [`ReadWriteLock`], [`LockKind::Semaphore`] from [`LockRegistry::semaphore`].
    pub fn kind(&self) -> LockKind {
        self.slot.name.kind()
    }

    /// The lease that acquisitions through this handle ask for.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The same lock with another lease for the acquisitions made through the returned handle.
    /// Fails when the lease is shorter than 10 ms or longer than a day.
    pub fn with_lease(&self, lease: Duration) -> Result<Lock> {
        check_lease(lease)?;
        Ok(Lock {
            lease,
            ..self.clone()
        })
    }

    /// Who the holds taken through this handle say they are (the registry's
    /// [`owner`](RegistryOptions::owner) unless [`with_owner`](Self::with_owner) named another).
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The same lock, its holds described as `owner` (see [`Owner`]): for instance a job's
    /// name, so that `distlock list` tells which job holds the key.
    pub fn with_owner(&self, owner: Owner) -> Lock {
        Lock {
            owner,
            ..self.clone()
        }
    }

    /// The same lock, each of whose holds is kept at least `at_least` after it was acquired,
    /// however soon it is released or dropped: ShedLock's `lockAtLeastFor`, for a scheduled
    /// job that another instance, whose clock or schedule is a little off, must not run again
    /// at once. The hold is renewed meanwhile, and not handed to a local waiter before then.
    /// Fails when `at_least` is longer than a day ([`MAX_LEASE`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// # use distlock::{LockRegistry, backends::memory::MemoryBackend};
    /// use std::time::Duration;
    /// # let registry = LockRegistry::new(MemoryBackend::new());
    /// let job = registry.obtain("nightly-report")?.with_at_least(Duration::from_millis(50))?;
    /// let started = tokio::time::Instant::now();
    /// job.lock().await?.release().await?; // the job was quick; the lock was not
    /// assert!(started.elapsed() >= Duration::from_millis(50));
    /// # Ok(()) }
    /// ```
    pub fn with_at_least(&self, at_least: Duration) -> Result<Lock> {
        if at_least > MAX_LEASE {
            return Err(Error::InvalidConfig(format!(
                "at_least {at_least:?} is longer than a day"
            )));
        }
        Ok(Lock {
            at_least: (!at_least.is_zero()).then_some(at_least),
            ..self.clone()
        })
    }

    /// See [`with_at_least`](Self::with_at_least).
    pub fn at_least(&self) -> Option<Duration> {
        self.at_least
    }

    /// Waits until the lock is acquired, however long that takes.
    ///
    /// The async API is not reentrant: a task that calls `lock` while it holds a guard of the
    /// same key waits for itself (use [`try_lock_for`](Self::try_lock_for) to bound that, or
    /// pass the guard along). The [`blocking`](crate::blocking) facade is reentrant per thread.
    ///
    /// A backend error ends the wait with that error, so an outage is reported rather than
    /// waited out; [`try_lock_for`](Self::try_lock_for) retries transient errors
    /// ([`Error::is_retryable`]) within its timeout instead.
    ///
    /// Whatever way an acquisition ends without a guard (an error, a timeout, cancellation),
    /// it leaves no lock held: if any of its attempts may have succeeded on the server without
    /// the reply arriving, its token is released in the background, after that attempt ended.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no waiter entry behind and no lock held (a remote
    /// attempt that was in flight is driven to its end in the background and then given back,
    /// so the release cannot overtake it; [`LockRegistry::flush`] waits for that).
    pub async fn lock(&self) -> Result<LockGuard> {
        self.acquire(Wait::Forever).await
    }

    /// Takes the lock if it is free right now, else fails with [`Error::NotAcquired`]. Makes one
    /// remote attempt at most.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<LockGuard> {
        self.acquire(Wait::No).await
    }

    /// Waits at most `timeout` for the lock, else fails with [`Error::NotAcquired`]. Transient
    /// backend errors are retried within the timeout. The timeout also bounds a request in
    /// flight: a reply due after it is not waited for (the attempt is undone in the
    /// background, as for a cancelled [`lock`](Self::lock)). A zero timeout is
    /// [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_for(&self, timeout: Duration) -> Result<LockGuard> {
        if timeout.is_zero() {
            return self.acquire(Wait::No).await;
        }
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.acquire(Wait::Until(deadline)).await,
            None => self.acquire(Wait::Forever).await,
        }
    }

    /// The holds threads took through the blocking facade, shared by all handles of the key.
    pub(crate) fn thread_holds(&self) -> std::sync::MutexGuard<'_, Vec<ThreadHold>> {
        self.slot
            .local()
            .thread_holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the state of the lock's key on the backend, whatever kind holds it: `None` when
    /// nobody holds it.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<Option<LockInfo>> {
        self.registry.backend.inspect(&self.slot.name).await
    }
}

/// A read-write lock: its two sides are [`Lock`] handles with the usual `lock`, `try_lock`
/// and `try_lock_for` (and leases, renewal, lost signal and fences). From
/// [`LockRegistry::read_write`].
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    read: Lock,
    write: Lock,
}

impl ReadWriteLock {
    /// The key.
    pub fn key(&self) -> &str {
        self.read.key()
    }

    /// The shared side: its guards hold the key together with other readers.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The exclusive side: its guard holds the key alone.
    pub fn write(&self) -> &Lock {
        &self.write
    }

    /// The same lock with another lease for the acquisitions made through the returned
    /// handles (see [`Lock::with_lease`]).
    pub fn with_lease(&self, lease: Duration) -> Result<ReadWriteLock> {
        Ok(ReadWriteLock {
            read: self.read.with_lease(lease)?,
            write: self.write.with_lease(lease)?,
        })
    }

    /// The same lock, its holds described as `owner` (see [`Lock::with_owner`]).
    pub fn with_owner(&self, owner: Owner) -> ReadWriteLock {
        ReadWriteLock {
            read: self.read.with_owner(owner.clone()),
            write: self.write.with_owner(owner),
        }
    }
}
