//! The [`Backend`] trait: the few atomic operations a coordination service must offer, plus the
//! types they exchange. Everything else (local lock, waiting, renewal, loss detection) lives in the
//! registry and is shared by every backend.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};

mod capabilities;
mod kind;
mod notify;
mod owner;
mod request;

pub use self::capabilities::{Capabilities, Fencing};
pub use self::kind::{LockKind, MAX_PERMITS};
pub use self::notify::{ReleaseSignal, ReleaseSignals, ReleaseSubscription};
pub use self::owner::{Owner, MAX_OWNER_LEN, UNKNOWN_OWNER};
pub use self::request::{AcquireMode, AcquireRequest};

/// Longest key accepted, in bytes of UTF-8.
pub const MAX_KEY_LEN: usize = 1024;

/// A 128-bit random owner token, new for every remote acquisition.
///
/// Release and extension are checked against it on the server, so nobody can release a lock
/// they do not hold. Its text form is 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(u128);

impl Token {
    /// A fresh random token from the operating system's generator.
    pub fn random() -> Self {
        Token(rand::random::<u128>())
    }

    /// The token's 128 bits.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Parses the 32-hex-digit text form.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(Token)
    }
}

impl From<u128> for Token {
    fn from(v: u128) -> Self {
        Token(v)
    }
}

impl Token {
    /// The text form (32 lowercase hex digits) without allocating.
    pub fn to_hex_bytes(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = DIGITS[((self.0 >> (124 - 4 * i)) & 0xf) as usize];
        }
        out
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex_bytes();
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

/// Where a lock lives in a backend: the registry's prefix (namespace), the caller's key, and
/// the [`LockKind`] of the holds made through it.
///
/// Each backend maps the prefix and key into its own key space (`<prefix>:<key>` on Redis, a
/// row keyed by region and key in SQL, ...); all kinds of one key live at the same place and
/// exclude each other there. Two names are equal when prefix, key and kind are (whether it
/// is an election's is not compared: a backend without a layout of its own for elections
/// keeps an election as the key's mutex). Cloning is cheap.
#[derive(Clone)]
pub struct LockName {
    prefix: Arc<str>,
    key: Arc<str>,
    kind: LockKind,
    election: bool,
}

impl PartialEq for LockName {
    fn eq(&self, other: &Self) -> bool {
        self.prefix == other.prefix && self.key == other.key && self.kind == other.kind
    }
}

impl Eq for LockName {}

// As `eq`: without the election flag.
impl std::hash::Hash for LockName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.prefix.hash(state);
        self.key.hash(state);
        self.kind.hash(state);
    }
}

impl LockName {
    /// The mutex `key` under `prefix`, after checking the key (non-empty, at most
    /// [`MAX_KEY_LEN`] bytes, no NUL).
    pub fn new(prefix: impl Into<Arc<str>>, key: &str) -> Result<Self> {
        validate_key(key)?;
        Ok(LockName {
            prefix: prefix.into(),
            key: Arc::from(key),
            kind: LockKind::Mutex,
            election: false,
        })
    }

    /// The same key as the mutex of an election ([`LockRegistry::election`]). Backends with a
    /// layout of their own for elections (etcd's `concurrency.Election`, Curator's
    /// `LeaderLatch` on ZooKeeper) hold, inspect and list it there; the others ignore the flag,
    /// so the election is the key's mutex.
    ///
    /// [`LockRegistry::election`]: crate::LockRegistry::election
    #[must_use]
    pub fn for_election(mut self) -> Self {
        self.kind = LockKind::Mutex;
        self.election = true;
        self
    }

    /// Whether holds through this name are candidates of an election (see
    /// [`for_election`](Self::for_election)).
    pub fn is_election(&self) -> bool {
        self.election
    }

    /// The same key with holds of `kind`.
    #[must_use]
    pub fn with_kind(mut self, kind: LockKind) -> Self {
        self.kind = kind;
        self
    }

    /// The registry's prefix, such as `lock`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The caller's key, such as `voucher:42`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The kind of the holds made through this name.
    pub fn kind(&self) -> LockKind {
        self.kind
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.prefix, self.key)?;
        if self.kind != LockKind::Mutex {
            write!(f, " ({})", self.kind)?;
        }
        if self.election {
            f.write_str(" (election)")?;
        }
        Ok(())
    }
}

/// Checks a key against the rules every backend relies on.
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidKey("the key is empty".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::InvalidKey(format!(
            "the key is {} bytes long; at most {MAX_KEY_LEN} are allowed",
            key.len()
        )));
    }
    if key.contains('\0') {
        return Err(Error::InvalidKey("the key contains a NUL character".into()));
    }
    Ok(())
}

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The lock is ours; `fence` is larger than that of every earlier holder of the key.
    Acquired {
        /// The backend's fencing token for this acquisition.
        fence: u64,
    },
    /// Somebody else holds the lock.
    Busy {
        /// The holder's remaining lease, where the backend knows it, or sooner when the
        /// backend needs the waiter back (to keep its place in a queue whose places expire);
        /// waiters poll again no later than this.
        retry_after: Option<Duration>,
        /// How many contenders (holders and waiters) the backend's queue has before this
        /// token, where it knows it. A backend reports it only when it wakes a queued token
        /// in its turn by itself (a watch on its predecessor, as ZooKeeper and etcd keep), so
        /// that polling only guards against a lost wake-up: a waiter with `n` contenders
        /// before it then polls `n - 1` times less often (the head and the waiter behind it
        /// at the registry's pace), and the polls of W waiters grow with log W, not W.
        /// A backend whose line does not tell the place (MariaDB's turnstile, a `GET_LOCK`
        /// queue) may report a nominal place for a waiter it wakes in turn, which sets that
        /// waiter's safety pace (documented by the backend).
        /// `None`: every waiter polls at the registry's pace.
        ahead: Option<u32>,
    },
    /// The lock is ours: a release handed it to this token after the server answered the
    /// token's last [`Attempt::Busy`] (a backend with a wait queue may tell the head waiter so
    /// with its wake-up, which saves it a round trip; the answer may then come without I/O).
    /// The caller counts the lease from before that busy attempt was sent, so a backend
    /// returns it only for a hand-over it knows came after the server answered that attempt:
    /// news of an earlier hand-over can arrive after the busy reply (the process was stopped,
    /// or a notification lagged), and by then that hand-over's lease has run out.
    HandedOver {
        /// The backend's fencing token for this acquisition.
        fence: u64,
    },
}

impl Attempt {
    /// [`Attempt::Busy`] with nothing more to tell: no remaining lease known, no place in a
    /// queue.
    pub const BUSY: Attempt = Attempt::Busy {
        retry_after: None,
        ahead: None,
    };
}

/// The outcome of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Released {
    /// The lock was still held with the given token and is now free.
    pub was_held: bool,
    /// Other clients appeared to be waiting (for instance, the release message reached other
    /// subscribers). The registry then lets them go first instead of taking the lock straight back.
    pub contended: bool,
}

/// What [`Backend::inspect`] sees of a lock. Build it with [`LockInfo::new`] and the `with_*`
/// setters (fields are added over time, hence `#[non_exhaustive]`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The fence of the current holder (the highest among several holders), where the backend
    /// records it. Redis records the latest fence issued for the key: an uncontended attempt
    /// takes one with its `SET NX`, whether it wins or not, so this may be above the holder's
    /// (never below it).
    pub fence: Option<u64>,
    /// The remaining lease (the longest among several holders), where the backend knows it.
    pub remaining: Option<Duration>,
    /// The kind of the holds, where the backend can tell. A semaphore's `permits` are those
    /// its holders announced, or 0 when the layout does not record them.
    pub kind: Option<LockKind>,
    /// How many hold the lock now, where the backend can tell.
    pub holders: Option<u32>,
    /// How many wait for it, where the backend can tell (its queue, or the waiters it sees).
    pub waiters: Option<u32>,
    /// Who holds it: the [`Owner`] description of each holder (one for a mutex or a writer,
    /// one per reader or per permit holder), sorted, where the backend records them
    /// ([`Capabilities::owners`]); [`UNKNOWN_OWNER`] for a holder whose layout says nothing
    /// (a foreign client). Empty where the backend cannot tell.
    pub owners: Vec<String>,
}

impl LockInfo {
    /// A held lock with `fence` and `remaining` lease, kind, holders and waiters unknown.
    pub fn new(fence: Option<u64>, remaining: Option<Duration>) -> Self {
        LockInfo {
            fence,
            remaining,
            kind: None,
            holders: None,
            waiters: None,
            owners: Vec::new(),
        }
    }

    /// Sets [`kind`](Self::kind).
    #[must_use]
    pub fn with_kind(mut self, kind: LockKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Sets [`holders`](Self::holders).
    #[must_use]
    pub fn with_holders(mut self, holders: u32) -> Self {
        self.holders = Some(holders);
        self
    }

    /// Sets [`waiters`](Self::waiters).
    #[must_use]
    pub fn with_waiters(mut self, waiters: u32) -> Self {
        self.waiters = Some(waiters);
        self
    }

    /// Sets [`owners`](Self::owners), sorted.
    #[must_use]
    pub fn with_owners(mut self, owners: impl IntoIterator<Item = String>) -> Self {
        self.owners = owners.into_iter().collect();
        self.owners.sort();
        self
    }
}

/// One held lock as [`Backend::list`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedLock {
    /// The caller's key (without the prefix).
    pub key: String,
    /// What [`Backend::inspect`] would say of it.
    pub info: LockInfo,
}

/// One lease to renew in a batch.
#[derive(Debug, Clone)]
pub struct Renewal {
    /// The lock.
    pub name: LockName,
    /// The owner token it was acquired with.
    pub token: Token,
    /// The new lease, counted from when the server applies it.
    pub lease: Duration,
}

/// The atomic operations a coordination service offers to the registry, each named once.
///
/// The registry owns everything else: the local lock, tokens, deadlines, waiting, renewal and
/// loss detection. Every method is one (or a few pipelined) round trips and must be atomic on
/// the server.
///
/// # State
/// A backend keeps no state that decides who holds a lock: the server decides, so two backend
/// values (or two processes) over the same server agree. It may keep per-lock state that serves
/// the protocol, as long as it is bounded by the live tokens and subscriptions and goes with
/// them: connection pools, the release-notification table ([`ReleaseSignals`]), a wait-queue
/// entry per queued token, the session that carries a holder's lease (etcd's lease, ZooKeeper's
/// session and ephemeral node per token) and the watches on a waiter's predecessor. Such state
/// is keyed by token and dropped by [`release`](Backend::release) and
/// [`leave_queue`](Backend::leave_queue) (or reaped after a failed attempt).
///
/// # Cancel safety
/// A backend future may be dropped at any await point (a caller's timeout, a cancelled task).
/// Every method must then leave the server and the backend consistent: a connection whose
/// request was cut off is closed rather than reused, and no lock stays held beyond its lease.
/// A method whose request may still take effect after its future was dropped (a statement
/// already sent) documents it. A dropped [`acquire`](Backend::acquire) may still take the
/// lock (its request was on its way): SQLite, PostgreSQL and MySQL run the attempt as a task of
/// its own and give such a lock back once the attempt ends (`backend::detached_attempt`, the
/// one place for that undo); on the other backends it is held until its lease ends unless the
/// caller releases the token.
///
/// The registry does not rely on that alone: its attempts run detached from the caller (an
/// abandoned attempt is driven to its end in the background, never dropped midway), and when
/// an acquisition ends without a guard (error, timeout, cancellation) the registry releases the
/// token and leaves the queue in the background, ordered after the attempt, so the undo cannot
/// overtake it. Releases, extensions and subscriptions are owner-checked or idempotent, so a
/// dropped one is at worst repeated or left to the lease.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// What this backend is and can promise.
    fn capabilities(&self) -> Capabilities;

    /// A short name for errors, logs and metric labels: [`Capabilities::kind`].
    fn kind(&self) -> &'static str {
        self.capabilities().kind
    }

    /// One attempt to take `request.name` for `request.token` with `request.lease`. Never waits
    /// for the lock; with [`AcquireMode::Queue`] a backend with a fair queue also joins (or
    /// refreshes) the token's place in it when busy.
    ///
    /// The registry retries an attempt that failed (a timeout, a broken connection) with the
    /// same token, and the failed one may have succeeded on the server: a lock already held
    /// with `token` should count as acquired, with the lease set anew and a new fence, rather
    /// than as busy. An error therefore means "outcome unknown": whatever an attempt did, the
    /// registry gives the token back with [`Backend::release`] when the acquisition ends
    /// without a guard, and only once the attempt's future has completed; a backend whose
    /// request can still take effect after its future completed (a statement left running on a
    /// dropped connection) must prevent that or document it.
    ///
    /// A backend that learnt without asking how the attempt would end may answer with no I/O:
    /// [`Attempt::HandedOver`] for a lock a release handed to the token, and
    /// [`Attempt::Busy`] for a [`waits`](AcquireRequest::waits) try of a lock it knows to be
    /// somebody else's.
    ///
    /// # Cancel safety
    /// See the trait's `# Cancel safety`: dropped midway, the attempt leaves the lock free
    /// (possibly after it completed in the background) or held until its lease ends.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt>;

    /// Frees the lock if and only if it is held with `token`, and wakes waiters.
    ///
    /// # Cancel safety
    /// Dropped midway, the lock is released if the request reached the server and otherwise
    /// expires with its lease; the release is owner-checked, so repeating it is harmless.
    async fn release(&self, name: &LockName, token: Token) -> Result<Released>;

    /// Resets the lease if and only if the lock is still held with `token`; `Ok(false)` when it
    /// is not (expired, deleted, taken by someone else).
    ///
    /// # Cancel safety
    /// Dropped midway, the lease may or may not have been reset; the lock stays held no longer
    /// than the longer of the two leases.
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool>;

    /// Extends many leases at once. The default runs [`Backend::extend`] for each concurrently;
    /// backends that can batch (a Redis pipeline, one SQL statement) override it.
    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        futures_util::future::join_all(batch.iter().map(|r| self.extend(&r.name, r.token, r.lease)))
            .await
    }

    /// Starts listening for releases of `name` on behalf of the waiter with token `waiter`: the
    /// subscription fires on every release of the lock and, on a backend with a wait queue,
    /// when the backend hands the lock to that waiter. It must be active when this returns, so
    /// that a release after it is never missed. The registry calls it only when
    /// [`Capabilities::notifies_release`] is true. The default never fires: waiters poll.
    ///
    /// # Cancel safety
    /// Dropped midway, no subscription exists for the caller; bookkeeping a backend made for it
    /// goes when nobody listens (see [`ReleaseSignals`]).
    async fn subscribe(&self, name: &LockName, waiter: Token) -> Result<ReleaseSubscription> {
        let _ = (name, waiter);
        Ok(ReleaseSubscription::never())
    }

    /// Leaves the wait queue joined by an [`AcquireMode::Queue`] attempt (the caller gave up).
    /// The default does nothing.
    ///
    /// # Cancel safety
    /// Dropped midway, the place may stay until it expires (a backend's queue entries expire,
    /// or go with the session); the registry retries it in the background.
    async fn leave_queue(&self, name: &LockName, token: Token) -> Result<()> {
        let _ = (name, token);
        Ok(())
    }

    /// The longest lease this backend is known to grant, when it is shorter than the default
    /// lease may be: a registry whose lease was not set explicitly takes this one instead of
    /// failing on every acquisition. No I/O. The default knows no limit.
    fn longest_lease(&self) -> Option<Duration> {
        None
    }

    /// Reads the current state of a lock without changing it: `None` when free.
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>>;

    /// Frees the lock whoever holds it, as an operator would (`distlock unlock --force`), and
    /// wakes waiters. Returns whether a holder was removed. The holder learns that it lost the
    /// lock at its next renewal; fences keep increasing. The default fails with
    /// [`Error::Unsupported`].
    ///
    /// # Cancel safety
    /// Dropped midway, the lock may or may not have been removed; check with
    /// [`inspect`](Backend::inspect).
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let _ = name;
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "force release".into(),
        })
    }

    /// The locks held under `prefix` now, of every kind, each as [`inspect`](Backend::inspect)
    /// would describe it, in no particular order (`distlock list`). Keys of other prefixes
    /// never appear, also where one prefix starts another. The default fails with
    /// [`Error::Unsupported`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let _ = prefix;
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "listing locks".into(),
        })
    }
}

// `detached` and `detached_attempt` serve only the backends that talk to a server or a file (the
// attributes name them), so a build without those leaves them (and their helpers) unused.

/// Runs `fut` as a task of its own and waits for its outcome: a caller that stops waiting
/// (its future is dropped) never cuts a request off midway, so no connection is left half-way
/// through a protocol. With a `deadline`, the task is stopped after it (pool waits,
/// connecting, retries and replies included) and the call fails with [`Error::Unavailable`],
/// "`<context>: no reply within <deadline>`"; a connection whose request was cut off that way
/// must be closed by the future's own drop guards. `context` names the operation (and
/// server) and is only called on a timeout.
#[cfg_attr(
    not(any(feature = "etcd", feature = "mysql", feature = "postgres")),
    allow(dead_code)
)]
pub(crate) async fn detached<T: Send + 'static>(
    kind: &'static str,
    context: impl FnOnce() -> String + Send + 'static,
    deadline: Option<Duration>,
    fut: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    joined(
        kind,
        tokio::spawn(bounded(kind, context, deadline, fut)).await,
    )
}

/// Runs `fut` in the caller's task, and only if the caller stops waiting (its future is
/// dropped) moves what is left of it into a task of its own: as [`detached`], a request is
/// never cut off midway, but a call that is waited for to its end costs no task, no wake-up
/// of another task and no hand-over to another worker thread. A panic of `fut` is the error
/// [`detached`] gives for it.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) async fn detach_on_drop<T: Send + 'static>(
    kind: &'static str,
    fut: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    use futures_util::FutureExt;
    use std::pin::Pin;

    struct Carry<F: Future<Output = ()> + Send + 'static> {
        fut: Option<Pin<Box<F>>>,
        runtime: tokio::runtime::Handle,
    }
    impl<F: Future<Output = ()> + Send + 'static> Drop for Carry<F> {
        fn drop(&mut self) {
            if let Some(fut) = self.fut.take() {
                self.runtime.spawn(fut);
            }
        }
    }

    let (tx, rx) = tokio::sync::oneshot::channel();
    let run = async move {
        let outcome = std::panic::AssertUnwindSafe(fut).catch_unwind().await;
        let _ = tx.send(outcome);
    };
    let mut carry = Carry {
        fut: Some(Box::pin(run)),
        runtime: tokio::runtime::Handle::current(),
    };
    if let Some(fut) = carry.fut.as_mut() {
        fut.await;
    }
    // Finished: nothing is left to carry on.
    carry.fut = None;
    match rx.await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(Error::backend(kind, "the backend's task panicked")),
        Err(_) => Err(Error::unavailable(
            kind,
            "the backend's task was cancelled (runtime shutting down)",
        )),
    }
}

/// [`detached`] for an acquisition attempt, with its undo in one place: if the attempt
/// acquired the lock but nobody is left to receive the outcome (the caller's future was
/// dropped), `undo` gives the lock back, in the same task, so only after the attempt ended.
/// An attempt that fails leaves the undo to its caller (an error means "outcome unknown", see
/// [`Backend::acquire`]).
#[cfg_attr(
    not(any(feature = "mysql", feature = "postgres", feature = "sqlite")),
    allow(dead_code)
)]
pub(crate) async fn detached_attempt<U, UF>(
    kind: &'static str,
    context: impl FnOnce() -> String + Send + 'static,
    deadline: Option<Duration>,
    attempt: impl Future<Output = Result<Attempt>> + Send + 'static,
    undo: U,
) -> Result<Attempt>
where
    U: FnOnce() -> UF + Send + 'static,
    UF: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let outcome = bounded(kind, context, deadline, attempt).await;
        if let Err(Ok(Attempt::Acquired { .. } | Attempt::HandedOver { .. })) = tx.send(outcome) {
            undo().await;
        }
        Ok(())
    });
    match rx.await {
        Ok(outcome) => outcome,
        // The task ended without an outcome: it panicked or the runtime is shutting down.
        Err(_) => joined(kind, task.await).and_then(|()| {
            Err(Error::backend(
                kind,
                "the acquisition task ended without an outcome",
            ))
        }),
    }
}

async fn bounded<T>(
    kind: &'static str,
    context: impl FnOnce() -> String,
    deadline: Option<Duration>,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    match deadline {
        Some(limit) => match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(
                kind,
                format!("{}: no reply within {limit:?}", context()),
            )),
        },
        None => fut.await,
    }
}

fn joined<T>(
    kind: &'static str,
    r: std::result::Result<Result<T>, tokio::task::JoinError>,
) -> Result<T> {
    match r {
        Ok(r) => r,
        Err(e) if e.is_panic() => Err(Error::backend(kind, "the backend's task panicked")),
        Err(_) => Err(Error::unavailable(
            kind,
            "the backend's task was cancelled (runtime shutting down)",
        )),
    }
}

#[cfg(all(test, feature = "etcd"))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn detach_on_drop_finishes_a_dropped_call_and_answers_a_finished_one() {
        assert_eq!(detach_on_drop("t", async { Ok(7) }).await.unwrap(), 7);

        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let started = Arc::new(AtomicBool::new(false));
        let s = started.clone();
        let call = detach_on_drop("t", async move {
            s.store(true, Ordering::SeqCst);
            let _ = wait.await;
            let _ = done_tx.send(());
            Ok(())
        });
        // Started in the caller's task, then given up while it waits.
        let mut call = Box::pin(call);
        assert!(futures_util::FutureExt::now_or_never(call.as_mut()).is_none());
        assert!(started.load(Ordering::SeqCst));
        drop(call);
        go.send(()).unwrap();
        done.await
            .expect("the rest of the call ran after its caller left");

        let e = detach_on_drop::<()>("t", async { panic!("boom") }).await;
        assert!(e.unwrap_err().to_string().contains("panicked"));
    }
}
