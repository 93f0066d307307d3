//! [`LockRegistry`] and [`Lock`]: handles cached by key, the local lock taken before the remote
//! one, and acquisition with deadlines, notifications and cancel safety.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{
    AcquireMode, Attempt, Backend, LockInfo, LockName, ReleaseSubscription, Token,
};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::renewal::{compose_fence, Hold, Renewer, LOCAL_SEQ_BITS};

/// Shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Longest lease accepted.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// How a [`LockRegistry`] behaves. Build with [`RegistryOptions::default`] and the `with_*`
/// setters; the getters carry the plain names.
///
/// ```
/// use std::time::Duration;
/// use distlock::RegistryOptions;
/// let opts = RegistryOptions::default()
///     .with_prefix("billing")
///     .with_lease(Duration::from_secs(10));
/// assert_eq!(opts.prefix(), "billing");
/// assert_eq!(opts.lease(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    prefix: String,
    lease: Duration,
    renew: bool,
    max_local_handoffs: u32,
    max_cached_locks: usize,
    max_poll_interval: Option<Duration>,
    contended_release_grace: Duration,
    client_id: String,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            prefix: "lock".into(),
            lease: Duration::from_secs(30),
            renew: true,
            max_local_handoffs: 32,
            max_cached_locks: 10_000,
            max_poll_interval: None,
            contended_release_grace: Duration::from_millis(20),
            client_id: Token::random().to_string(),
        }
    }
}

impl RegistryOptions {
    /// Namespace of every key (default `lock`; Redis keys are `<prefix>:<key>`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
    /// Default lease of a remote hold (default 30 s); a [`Lock`] may override it.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// Renew leases while guards live (default true). Without renewal a hold ends with its lease.
    pub fn with_renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }
    /// How many times in a row a remote hold may pass straight to a local waiter before it is
    /// released remotely so that other processes get their turn (default 32, at most 1023).
    pub fn with_max_local_handoffs(mut self, n: u32) -> Self {
        self.max_local_handoffs = n;
        self
    }
    /// Bound of the handle cache (default 10 000). Held locks are never evicted; idle handles
    /// are, oldest first, when the bound is reached.
    pub fn with_max_cached_locks(mut self, n: usize) -> Self {
        self.max_cached_locks = n;
        self
    }
    /// Longest pause between two attempts of a waiter that has not been notified. Default:
    /// 500 ms on backends that notify releases (polling only catches expiry there), 50 ms on
    /// the others.
    pub fn with_max_poll_interval(mut self, d: Duration) -> Self {
        self.max_poll_interval = Some(d);
        self
    }
    /// After releasing a lock that others were waiting for (as far as the backend reports it
    /// through [`Released::contended`](crate::Released)), how long this registry lets them go
    /// first before contending for it again (default 20 ms; it ends at the next release
    /// notification). Zero allows barging. Backends with a fair wait queue (Redis) need none.
    pub fn with_contended_release_grace(mut self, d: Duration) -> Self {
        self.contended_release_grace = d;
        self
    }
    /// Identifies this registry in logs (default random): every acquisition, extension and
    /// release span carries it as its `client` field, so the holds of one service can be told
    /// apart from another's in traces.
    pub fn with_client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }
    /// The namespace of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The default lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// Whether leases are renewed while guards live.
    pub fn renew(&self) -> bool {
        self.renew
    }
    /// The bound on consecutive local handoffs of one remote hold.
    pub fn max_local_handoffs(&self) -> u32 {
        self.max_local_handoffs
    }
    /// The bound of the handle cache.
    pub fn max_cached_locks(&self) -> usize {
        self.max_cached_locks
    }
    /// The longest pause between two polls of a waiter, when set (else the backend's default).
    pub fn max_poll_interval(&self) -> Option<Duration> {
        self.max_poll_interval
    }
    /// How long a releasing registry lets remote waiters go first.
    pub fn contended_release_grace(&self) -> Duration {
        self.contended_release_grace
    }
    /// This registry's identity in logs: the `client` field of its tracing spans.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    fn validate(&self) -> Result<()> {
        check_lease(self.lease)?;
        if self.prefix.is_empty() || self.prefix.len() > 256 || self.prefix.contains('\0') {
            return Err(Error::config(
                "the prefix must be 1 to 256 bytes without NUL",
            ));
        }
        if self.max_local_handoffs >= 1 << LOCAL_SEQ_BITS {
            return Err(Error::config(format!(
                "max_local_handoffs must be below {}",
                1 << LOCAL_SEQ_BITS
            )));
        }
        if self.max_cached_locks == 0 {
            return Err(Error::config("max_cached_locks must be at least 1"));
        }
        if let Some(p) = self.max_poll_interval {
            if p.is_zero() {
                return Err(Error::config("max_poll_interval must be positive"));
            }
        }
        Ok(())
    }
}

pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(Error::config(format!(
            "lease {lease:?} is outside {MIN_LEASE:?}..={MAX_LEASE:?}"
        )));
    }
    Ok(())
}

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
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) opts: RegistryOptions,
    prefix: Arc<str>,
    slots: Mutex<HashMap<Arc<str>, Arc<Slot>>>,
    pub(crate) renewer: Arc<Renewer>,
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
    pub(crate) state: Arc<tokio::sync::Mutex<SlotState>>,
    pub(crate) waiters: AtomicUsize,
    last_used_ms: AtomicU64,
    /// The hold a thread took through the blocking facade, which is reentrant per thread.
    pub(crate) thread_hold: Mutex<Option<ThreadHold>>,
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
    pub fn from_backend(backend: Arc<dyn Backend>, options: RegistryOptions) -> Result<Self> {
        options.validate()?;
        let renewer = Arc::new(Renewer::new(backend.clone(), options.renew));
        Ok(LockRegistry {
            inner: Arc::new(Inner {
                prefix: Arc::from(options.prefix.as_str()),
                backend,
                opts: options,
                slots: Mutex::new(HashMap::new()),
                renewer,
                epoch: Instant::now(),
            }),
        })
    }

    /// Connects to the backend named by `url` (see [`crate::connect`]) and builds a registry.
    pub async fn connect(url: &str, options: RegistryOptions) -> Result<Self> {
        Self::from_backend(crate::connect::connect(url).await?, options)
    }

    /// The lock handle for `key`. Cheap: handles are cached, and all handles of one key in one
    /// registry share one local lock. Fails only on an invalid key.
    pub fn obtain(&self, key: &str) -> Result<Lock> {
        let inner = &self.inner;
        let mut slots = inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match slots.get(key) {
            Some(s) => s.clone(),
            None => {
                let name = LockName::new(inner.prefix.clone(), key)?;
                if slots.len() >= inner.opts.max_cached_locks {
                    evict_idle(
                        &mut slots,
                        inner.opts.max_cached_locks - inner.opts.max_cached_locks / 10,
                    );
                }
                let slot = Arc::new(Slot {
                    name,
                    state: Arc::new(tokio::sync::Mutex::new(SlotState::default())),
                    waiters: AtomicUsize::new(0),
                    last_used_ms: AtomicU64::new(0),
                    thread_hold: Mutex::new(None),
                });
                slots.insert(Arc::from(key), slot.clone());
                slot
            }
        };
        drop(slots);
        slot.last_used_ms.store(inner.now_ms(), Ordering::Relaxed);
        Ok(Lock {
            slot,
            registry: inner.clone(),
            lease: inner.opts.lease,
        })
    }

    /// Drops cached handles that are idle (not held, not waited for, not referenced outside the
    /// registry) and were last obtained or locked longer than `age` ago. Returns how many.
    pub fn expire_unused_older_than(&self, age: Duration) -> usize {
        let now = self.inner.now_ms();
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        let mut slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        let before = slots.len();
        slots.retain(|_, s| {
            !(s.is_idle() && now.saturating_sub(s.last_used_ms.load(Ordering::Relaxed)) >= age_ms)
        });
        before - slots.len()
    }

    /// How many lock handles are cached.
    pub fn cached_locks(&self) -> usize {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
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

fn evict_idle(slots: &mut HashMap<Arc<str>, Arc<Slot>>, target: usize) {
    let mut idle: Vec<(u64, Arc<str>)> = slots
        .iter()
        .filter(|(_, s)| s.is_idle())
        .map(|(k, s)| (s.last_used_ms.load(Ordering::Relaxed), k.clone()))
        .collect();
    idle.sort_unstable();
    let excess = slots.len().saturating_sub(target);
    for (_, k) in idle.into_iter().take(excess) {
        slots.remove(&k);
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn max_poll(&self) -> Duration {
        self.opts.max_poll_interval.unwrap_or_else(|| {
            if self.backend.capabilities().notifies_release {
                Duration::from_millis(500)
            } else {
                Duration::from_millis(50)
            }
        })
    }

    /// Gives a remote hold back in the background (cancelled acquisitions, stale holds).
    pub(crate) fn release_in_background(&self, name: LockName, token: Token) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let backend = self.backend.clone();
            rt.spawn(async move {
                if let Err(e) = backend.release(&name, token).await {
                    tracing::debug!(lock = ?name, error = %e, "background release failed; the lease will expire");
                }
            });
        }
    }
}

impl Slot {
    /// Only the cache refers to it and nobody holds or waits for it.
    fn is_idle(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1
            && self.waiters.load(Ordering::SeqCst) == 0
            && self
                .state
                .try_lock()
                .map(|s| s.hold.is_none())
                .unwrap_or(false)
    }

    /// Releases a remote hold left for a local waiter who then gave up. Called by whoever saw
    /// the last waiter leave; the double check (waiter count, then the local lock) means that
    /// of the leaving waiter and the handing-off guard at least one finds it.
    pub(crate) fn release_orphaned_hold(self: &Arc<Self>, registry: &Inner) {
        if self.waiters.load(Ordering::SeqCst) != 0 {
            return;
        }
        if let Ok(mut state) = self.state.clone().try_lock_owned() {
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
    slot: Arc<Slot>,
    registry: Arc<Inner>,
    lease: Duration,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.slot.name)
            .field("lease", &self.lease)
            .finish()
    }
}

#[derive(Clone, Copy)]
enum Wait {
    No,
    Until(Instant),
    Forever,
}

impl Wait {
    fn deadline(self) -> Option<Instant> {
        match self {
            Wait::No => Some(Instant::now()),
            Wait::Until(d) => Some(d),
            Wait::Forever => None,
        }
    }
}

impl Lock {
    /// The key.
    pub fn key(&self) -> &str {
        self.slot.name.key()
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
    /// so the release cannot overtake it).
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

    /// The hold a thread took through the blocking facade, shared by all handles of the key.
    pub(crate) fn thread_hold(&self) -> std::sync::MutexGuard<'_, Option<ThreadHold>> {
        self.slot
            .thread_hold
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the lock's state on the backend: `None` when nobody holds it.
    pub async fn inspect(&self) -> Result<Option<LockInfo>> {
        self.registry.backend.inspect(&self.slot.name).await
    }

    async fn acquire(&self, wait: Wait) -> Result<LockGuard> {
        let span = tracing::debug_span!(
            "distlock.acquire",
            key = %self.slot.name.key(),
            client = %self.registry.opts.client_id,
        );
        async move {
            let started = Instant::now();
            self.slot
                .last_used_ms
                .store(self.registry.now_ms(), Ordering::Relaxed);
            let res = match self.lock_local(wait, started).await {
                Ok(local) => self.acquire_remote(local, wait, started).await,
                Err(e) => Err(e),
            };
            let outcome = match &res {
                Ok(_) => "acquired",
                Err(Error::NotAcquired { .. }) => "not_acquired",
                Err(_) => "error",
            };
            crate::metrics::acquire(self.registry.backend.kind(), outcome, started.elapsed());
            res
        }
        .instrument(span)
        .await
    }

    fn not_acquired(&self, started: Instant) -> Error {
        Error::NotAcquired {
            key: self.key().to_owned(),
            waited: started.elapsed(),
        }
    }

    async fn lock_local(&self, wait: Wait, started: Instant) -> Result<OwnedMutexGuard<SlotState>> {
        let state = self.slot.state.clone();
        if let Ok(g) = state.clone().try_lock_owned() {
            return Ok(g);
        }
        if let Wait::No = wait {
            return Err(self.not_acquired(started));
        }
        let _waiting = WaiterEntry::new(&self.slot, &self.registry);
        match wait.deadline() {
            None => Ok(state.lock_owned().await),
            Some(d) => tokio::time::timeout_at(d, state.lock_owned())
                .await
                .map_err(|_| self.not_acquired(started)),
        }
    }

    async fn acquire_remote(
        &self,
        mut local: OwnedMutexGuard<SlotState>,
        wait: Wait,
        started: Instant,
    ) -> Result<LockGuard> {
        let reg = &self.registry;
        if let Some(hold) = local.hold.clone() {
            // Lock cohorting: take over the remote hold the previous local holder left us,
            // provided enough of its lease is left to be worth it.
            if worth_handing_off(&hold) {
                let seq = hold.local_seq.fetch_add(1, Ordering::AcqRel) + 1;
                let fence = compose_fence(hold.backend_fence, seq);
                return Ok(LockGuard::new(
                    self.slot.clone(),
                    reg.clone(),
                    local,
                    hold,
                    fence,
                ));
            }
            local.hold = None;
            reg.renewer.deregister(&hold);
            reg.release_in_background(hold.name.clone(), hold.token);
        }

        let backend = &reg.backend;
        let name = &self.slot.name;
        let deadline = wait.deadline();
        let waits = !matches!(wait, Wait::No);
        let token = Token::random();
        let max_poll = reg.max_poll();
        let caps = backend.capabilities();
        let notifies = caps.notifies_release;
        // A waiter joins the backend's fair queue, where there is one (and leaves it when it
        // gives up); elsewhere every attempt is a plain try.
        let mode = if waits && caps.fifo {
            AcquireMode::Queue
        } else {
            AcquireMode::Try
        };
        let mut sub: Option<ReleaseSubscription> = None;
        // With notifications, polling only catches expiry and lost messages: start slower.
        let mut poll = if notifies {
            max_poll / 4
        } else {
            Duration::from_millis(2)
        }
        .min(max_poll);
        let mut error_backoff = Duration::from_millis(20);
        let mut queued = QueueEntry {
            registry: reg,
            name,
            token,
            joined: false,
        };
        let mut was_busy = false;

        // Having just released a lock others were waiting for, let one of them have it first.
        if let Some(until) = local.yield_until.take().filter(|t| *t > Instant::now()) {
            let until = deadline.map_or(until, |d| d.min(until));
            if notifies {
                if let Ok(mut s) = backend.subscribe(name, token).await {
                    let _ = tokio::time::timeout_at(until, s.released()).await;
                    sub = Some(s);
                }
            } else {
                tokio::time::sleep_until(until).await;
            }
        }
        // The last acquisition of this key had to wait: expect to wait again and listen before
        // the first attempt, which saves the attempt that would follow a late subscription.
        if waits && notifies && sub.is_none() && local.contended {
            sub = backend.subscribe(name, token).await.ok();
        }

        // Armed once an attempt ended without telling us its outcome (an error, a lost reply):
        // the lock may then be ours on the server, so however this acquisition ends without a
        // guard (returned, or dropped at any await below), the token is given back.
        let mut uncertain = Abandoned {
            registry: reg,
            name,
            token,
            armed: false,
        };
        loop {
            let sent = Instant::now();
            let mut in_flight = InFlight::start(reg, name, token, self.lease, mode);
            // `try_lock_for` bounds its attempts too: a reply that comes after the deadline
            // is not waited for (the attempt finishes in the background, then is undone).
            let attempt = match wait {
                Wait::Until(d) => match tokio::time::timeout_at(d, in_flight.outcome()).await {
                    Ok(a) => a,
                    Err(_) => {
                        // The in-flight attempt's undo releases and leaves the queue, after it.
                        queued.joined = false;
                        uncertain.armed = false;
                        drop(in_flight);
                        local.contended = true;
                        return Err(self.not_acquired(started));
                    }
                },
                _ => in_flight.outcome().await,
            };
            in_flight.finished();
            uncertain.armed |= attempt.is_err();
            let retry_after = match attempt {
                Ok(Attempt::Acquired { .. }) if arrived_too_late(sent, self.lease) => {
                    // The reply took (nearly) the whole lease, counted from before the
                    // request: the server may have let the lease run out and handed the lock
                    // on meanwhile, and a guard made now would start out lost, or lose the
                    // lock before its first renewal could land. Give the token back (the
                    // attempt has completed, so the release cannot overtake it) and go on as
                    // if the lock had been busy.
                    tracing::debug!(waited = ?started.elapsed(), "acquired too late to hold");
                    queued.joined = false;
                    uncertain.armed = true;
                    if backend.release(name, token).await.is_ok() {
                        uncertain.armed = false;
                    }
                    was_busy = true;
                    None
                }
                Ok(Attempt::Acquired {
                    fence: backend_fence,
                }) => {
                    queued.joined = false;
                    uncertain.armed = false;
                    local.contended = was_busy;
                    let hold = Arc::new(Hold::new(
                        backend.kind(),
                        name.clone(),
                        token,
                        backend_fence,
                        self.lease,
                        sent,
                    ));
                    reg.renewer.register(hold.clone());
                    local.hold = Some(hold.clone());
                    let fence = compose_fence(backend_fence, 0);
                    tracing::debug!(fence, waited = ?started.elapsed(), "acquired");
                    return Ok(LockGuard::new(
                        self.slot.clone(),
                        reg.clone(),
                        local,
                        hold,
                        fence,
                    ));
                }
                Ok(Attempt::Busy { retry_after }) => {
                    queued.joined = mode == AcquireMode::Queue;
                    was_busy = true;
                    retry_after
                }
                Err(e) => {
                    let now = Instant::now();
                    match deadline {
                        Some(d) if e.is_retryable() && now + error_backoff < d => {
                            tracing::debug!(error = %e, "acquire attempt failed; retrying");
                            tokio::time::sleep(error_backoff).await;
                            error_backoff = (error_backoff * 2).min(Duration::from_secs(1));
                            continue;
                        }
                        _ => {
                            queued.leave().await;
                            return Err(e);
                        }
                    }
                }
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                queued.leave().await;
                local.contended = true;
                return Err(self.not_acquired(started));
            }
            if notifies && sub.is_none() {
                // Subscribe, then try again at once: a release between the failed attempt and
                // the subscription would otherwise go unnoticed until the next poll.
                // A subscription that fails leaves the waiter polling, which still works.
                sub = Some(backend.subscribe(name, token).await.unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "no release notifications; polling");
                    ReleaseSubscription::never()
                }));
                continue;
            }
            // Without a notification, poll: soon at first, then backing off, never later than
            // the holder's lease says the lock could be free.
            let mut delay = poll;
            if let Some(r) = retry_after {
                delay = delay
                    .max(Duration::from_millis(1))
                    .min(r + Duration::from_millis(1));
            }
            let delay = jitter(delay.min(max_poll));
            poll = (poll * 2).min(max_poll);
            let wake_at =
                deadline.map_or(Instant::now() + delay, |d| d.min(Instant::now() + delay));
            let span = tracing::trace_span!("distlock.wait", delay = ?delay);
            async {
                match sub.as_mut() {
                    Some(s) => {
                        let _ = tokio::time::timeout_at(wake_at, s.released()).await;
                    }
                    None => tokio::time::sleep_until(wake_at).await,
                }
            }
            .instrument(span)
            .await;
        }
    }
}

/// A place in the backend's wait queue: given back when the waiter gives up, in the
/// background if the acquisition future is dropped.
struct QueueEntry<'a> {
    registry: &'a Inner,
    name: &'a LockName,
    token: Token,
    joined: bool,
}

impl QueueEntry<'_> {
    async fn leave(&mut self) {
        if std::mem::take(&mut self.joined) {
            if let Err(e) = self
                .registry
                .backend
                .leave_queue(self.name, self.token)
                .await
            {
                tracing::debug!(error = %e, "leaving the wait queue failed; the entry will expire");
            }
        }
    }
}

impl Drop for QueueEntry<'_> {
    fn drop(&mut self) {
        if self.joined {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let backend = self.registry.backend.clone();
                let (name, token) = (self.name.clone(), self.token);
                rt.spawn(async move {
                    let _ = backend.leave_queue(&name, token).await;
                });
            }
        }
    }
}

fn jitter(d: Duration) -> Duration {
    let f: f64 = rand::random_range(0.8..1.2);
    d.mul_f64(f)
}

/// Counts a local waiter for as long as it waits; the last one to leave cleans up an orphaned
/// remote hold.
struct WaiterEntry<'a> {
    slot: &'a Arc<Slot>,
    registry: &'a Inner,
}

impl<'a> WaiterEntry<'a> {
    fn new(slot: &'a Arc<Slot>, registry: &'a Inner) -> Self {
        slot.waiters.fetch_add(1, Ordering::SeqCst);
        WaiterEntry { slot, registry }
    }
}

impl Drop for WaiterEntry<'_> {
    fn drop(&mut self) {
        if self.slot.waiters.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.slot.release_orphaned_hold(self.registry);
        }
    }
}

/// Gives back, in the background, a token that an earlier attempt may have acquired without
/// the reply saying so, unless disarmed by the acquisition that got its guard.
struct Abandoned<'a> {
    registry: &'a Inner,
    name: &'a LockName,
    token: Token,
    armed: bool,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.registry
                .release_in_background(self.name.clone(), self.token);
        }
    }
}

/// The outcome of one remote attempt, boxed so that it can outlive the acquisition future.
type AttemptFuture = Pin<Box<dyn Future<Output = Result<Attempt>> + Send>>;

/// One remote attempt in flight. If the acquisition ends before the attempt does (its future
/// is dropped, or `try_lock_for`'s deadline passes), the attempt may still succeed on the
/// server: it is then driven to its end in the background and only after that is its token
/// released and its place in the wait queue given back, so the undo can never overtake it.
struct InFlight<'a> {
    registry: &'a Inner,
    name: &'a LockName,
    token: Token,
    queued: bool,
    attempt: Option<AttemptFuture>,
}

impl<'a> InFlight<'a> {
    fn start(
        registry: &'a Inner,
        name: &'a LockName,
        token: Token,
        lease: Duration,
        mode: AcquireMode,
    ) -> Self {
        let backend = registry.backend.clone();
        let owned_name = name.clone();
        let attempt: AttemptFuture =
            Box::pin(async move { backend.acquire(&owned_name, token, lease, mode).await });
        InFlight {
            registry,
            name,
            token,
            queued: mode == AcquireMode::Queue,
            attempt: Some(attempt),
        }
    }

    /// Drives the attempt; cancel safe (the attempt stays here, see Drop).
    async fn outcome(&mut self) -> Result<Attempt> {
        match self.attempt.as_mut() {
            Some(attempt) => attempt.await,
            None => Err(Error::backend(
                "registry",
                "attempt polled after it finished",
            )),
        }
    }

    /// The attempt ended and its outcome was seen: nothing to undo here.
    fn finished(mut self) {
        self.attempt = None;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(attempt) = self.attempt.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(lock = ?self.name, "acquisition dropped outside a runtime; the lease will expire");
            return;
        };
        let backend = self.registry.backend.clone();
        let (name, token, queued) = (self.name.clone(), self.token, self.queued);
        rt.spawn(async move {
            // Finish the attempt first: a release sent beside it could reach the server first.
            // Release even after `Busy`: an earlier attempt with this token may have been the
            // one that succeeded (owner-checked, so harmless otherwise).
            let _ = attempt.await;
            if let Err(e) = backend.release(&name, token).await {
                tracing::debug!(lock = ?name, error = %e, "undoing an abandoned acquisition failed; the lease will expire");
            }
            if queued {
                let _ = backend.leave_queue(&name, token).await;
            }
        });
    }
}

// The local handoff protocol: a remote hold passes from a local guard to the next local waiter
// (`Inner::give_up`), which takes it over (`acquire_remote`) while it is worth it; a hold
// left for a waiter who then gave up is released by whoever sees the last waiter leave
// (`Slot::release_orphaned_hold`).

/// Whether an attempt sent at `sent` that reports the lock acquired came back too late to be
/// held: a tenth of the lease or less is left of it. The client counts the lease from before
/// the request, so the server's lease, counted from when it applied the attempt, never ends
/// before the client's; but once the client's has run out, somebody else may hold the lock.
fn arrived_too_late(sent: Instant, lease: Duration) -> bool {
    (sent + lease).saturating_duration_since(Instant::now()) <= lease / 10
}

/// Whether enough of a hold's lease is left to pass it to a local waiter: a renewal is due
/// at a third of the lease, so below that the next holder would start on a hold about to be
/// renewed or lost.
pub(crate) fn worth_handing_off(hold: &Hold) -> bool {
    hold.is_held() && hold.remaining() > hold.lease() / 3
}

impl Inner {
    /// Ends a guard's ownership of `slot`. Returns the local lock and the remote hold when the
    /// hold must be released remotely, `None` when it passed to a local waiter.
    pub(crate) fn give_up(
        &self,
        slot: &Arc<Slot>,
        mut local: OwnedMutexGuard<SlotState>,
        hold: &Arc<Hold>,
    ) -> Option<OwnedMutexGuard<SlotState>> {
        let pass_on = slot.waiters.load(Ordering::SeqCst) > 0
            && hold.local_seq.load(Ordering::Acquire) < self.opts.max_local_handoffs
            && worth_handing_off(hold);
        if pass_on {
            drop(local);
            // The waiter we counted may have left meanwhile; then the hold is nobody's.
            slot.release_orphaned_hold(self);
            return None;
        }
        local.hold = None;
        self.renewer.deregister(hold);
        Some(local)
    }

    /// Releases `hold` on the server, then lets the next local waiter in. Returns whether it
    /// was still held.
    pub(crate) async fn release_hold(
        &self,
        mut local: OwnedMutexGuard<SlotState>,
        hold: &Hold,
    ) -> Result<bool> {
        let released = self.backend.release(&hold.name, hold.token).await?;
        if released.contended {
            let grace = self.opts.contended_release_grace;
            if !grace.is_zero() {
                local.yield_until = Some(Instant::now() + grace);
            }
        }
        drop(local);
        Ok(released.was_held)
    }
}
