//! [`LockRegistry`]: the facade that hands out handles by key ([`Lock`], [`ReadWriteLock`],
//! [`MultiLock`], [`Election`]) over the state its clones share (`state.rs`), and waits for
//! its background work. `LockRegistry::connect` is in `connect.rs`, which knows the schemes.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, LockKind, LockName};
use crate::election::Election;
use crate::error::{Error, Result};
use crate::lock::{Lock, ReadWriteLock};
use crate::multi::MultiLock;
use crate::options::{RegistryOptions, MAX_LEASE, MIN_LEASE};
use crate::state::{Inner, Slot};

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

impl fmt::Debug for LockRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRegistry")
            .field("backend", &self.inner.backend)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
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
        Ok(LockRegistry {
            inner: Arc::new(Inner::new(backend, options)),
        })
    }

    /// The lock handle for `key`: a mutex. Cheap: handles are cached, and all handles of one
    /// key in one registry share one local lock. Fails only on an invalid key.
    pub fn obtain(&self, key: &str) -> Result<Lock> {
        Ok(self.handle(self.inner.slot_of_key(key)?))
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
        self.handle(self.inner.slot_of_name(name))
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

    /// The election `name`: its candidates hold the mutex of the key `name` (so `name` follows
    /// the key rules), with the registry's lease, in the backend's election layout (etcd's
    /// `concurrency.Election`, Curator's `LeaderLatch`; elsewhere the key's mutex itself: see
    /// [`Election`]). Its handle is cached apart from
    /// [`obtain(name)`](LockRegistry::obtain)'s.
    pub fn election(&self, name: &str) -> Result<Election> {
        Ok(Election::new(self.obtain_election(name)?))
    }

    /// Drops cached handles that are idle (not held, not waited for, not referenced outside the
    /// registry) and were last obtained or locked longer than `age` ago. Returns how many.
    pub fn expire_unused_older_than(&self, age: Duration) -> usize {
        self.inner.expire_unused_older_than(age)
    }

    /// How many lock handles are cached.
    pub fn cached_locks(&self) -> usize {
        self.inner.cached_locks()
    }

    /// Waits, at most `timeout`, until the releases and queue exits this registry left to
    /// background tasks have reached the backend: those of guards dropped without
    /// [`LockGuard::release`](crate::LockGuard::release), and the undo of acquisitions that
    /// were cancelled or timed out (an attempt still in flight is first awaited, then its
    /// token released and its wait-queue entry given back). Tasks started while it waits are
    /// waited for too. Returns true when none is left.
    ///
    /// Call it before the runtime ends (returning from `main`, after a signal, at the end of a
    /// server's graceful shutdown): a runtime that shuts down drops its tasks unfinished, and
    /// what they were to give back then stays held, or queued, until its lease runs out.
    ///
    /// It does not close the registry: acquisitions and renewals go on, and work started
    /// after it returns is not waited for. It releases no hold that a live guard has (release
    /// or drop those first), and it cannot undo what a backend request outside its deadline
    /// left behind: that lease expires as usual. Tasks run on the runtime that started them,
    /// so that runtime must keep running while this waits.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits. Dropping it leaves the tasks running on their runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// use std::time::Duration;
    /// use distlock::{LockRegistry, backends::memory::MemoryBackend};
    /// let registry = LockRegistry::new(MemoryBackend::new());
    /// let guard = registry.obtain("report")?.lock().await?;
    /// drop(guard); // released by a background task
    /// assert!(registry.flush(Duration::from_secs(5)).await);
    /// assert!(registry.obtain("report")?.inspect().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + MAX_LEASE);
        self.inner.background.settled(deadline).await
    }
}
