//! [`LeaseTable`]: the [`Backend`] of the lease tables on database servers (PostgreSQL,
//! MySQL/MariaDB), written once over an [`Engine`]: a member writes its statements and its
//! connections, and this module runs each operation as its own task within the backend's time
//! limits, gives back an attempt that took the lock after its caller went away, names the
//! server in messages without the password and derives the rows' keys and owners.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::kinds::{place, row_owner, Place, Share, WriterPlaces};
use super::shedlock::{locked_by, namespace, row_name};
use super::{channel, check_region, per_entry, scrub, spring_lock_key, token_uuid, SqlOptions};
use crate::backend::{
    detached, detached_attempt, AcquireRequest, Attempt, Backend, Capabilities, Fencing,
    ListedLock, LockInfo, LockName, ReleaseSignals, ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::Error;
use crate::error::Result;

/// Locks in a lease table on a database server, over the engine `E` (see
/// [`PostgresBackend`](super::postgres::PostgresBackend) and
/// [`MySqlBackend`](super::mysql::MySqlBackend)).
///
/// Cloning is cheap and shares the engine's connections. `Debug` shows the server, user, table
/// and mode, never the password.
pub struct LeaseTable<E> {
    pub(crate) inner: Arc<E>,
}

impl<E> Clone for LeaseTable<E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// What every engine's state holds: the server as messages name it, the options, and the
/// table's set-up and bookkeeping.
pub struct Common {
    /// `host:port/database` (no credentials), for messages.
    pub(crate) target: String,
    pub(crate) user: String,
    /// The password, scrubbed from every message.
    pub(crate) password: Option<String>,
    pub(crate) options: SqlOptions,
    /// Whether the table is known to exist (created once per backend, again after it
    /// vanished); `ready_fast` answers without the lock once it is.
    pub(crate) ready: tokio::sync::Mutex<bool>,
    pub(crate) ready_fast: AtomicBool,
    /// Whether the side table (native: the holds; Spring: the key names) exists.
    pub(crate) side_table: AtomicBool,
    /// The waiting writers of this backend that took a place.
    pub(crate) writers: WriterPlaces,
    /// Spring mode: the rows (LOCK_KEY, REGION) whose key name this backend recorded.
    pub(crate) named: Mutex<HashSet<(String, String)>>,
    /// This process's waiters, woken at once by its own releases.
    pub(crate) signals: Arc<ReleaseSignals>,
}

impl Common {
    /// A table nothing is known of yet on the server `target`.
    pub(crate) fn new(
        target: String,
        user: String,
        password: Option<String>,
        options: SqlOptions,
    ) -> Self {
        Self {
            target,
            user,
            password,
            options,
            ready: tokio::sync::Mutex::new(false),
            ready_fast: AtomicBool::new(false),
            side_table: AtomicBool::new(false),
            writers: WriterPlaces::default(),
            named: Mutex::default(),
            signals: Arc::default(),
        }
    }

    /// Spring mode: whether the key name of the row `(a, b)` is still to be recorded in the
    /// side table (once per key and backend, so that `list` can show the key).
    pub(crate) fn name_unrecorded(&self, a: &str, b: &str) -> bool {
        self.side_table.load(Ordering::Acquire)
            && !self
                .named
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&(a.to_owned(), b.to_owned()))
    }

    /// Remembers that the key name of the row `(a, b)` is recorded, forgetting them all past
    /// [`MAX_NAMED`].
    pub(crate) fn name_recorded(&self, a: &str, b: &str) {
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        if named.len() >= MAX_NAMED {
            named.clear();
        }
        named.insert((a.to_owned(), b.to_owned()));
    }
}

/// Most key names a Spring-mode backend remembers having recorded.
const MAX_NAMED: usize = 100_000;

/// One attempt as an engine makes it, the kind and layout already checked.
#[derive(Clone, Copy)]
pub struct Take<'a> {
    pub(crate) name: &'a LockName,
    pub(crate) token: Token,
    pub(crate) lease: Duration,
    /// For a caller that will wait (see [`AcquireRequest::queued`]).
    pub(crate) queued: bool,
    /// The owner column's description (ShedLock: all of `locked_by`).
    pub(crate) described: &'a str,
}

/// What a member of the lease-table family writes: its statements and connection handling.
/// Unreachable from outside the crate (its module is private), so that only the crate's
/// engines implement it.
pub trait Engine: Send + Sync + Sized + 'static {
    /// The backend's kind, for errors.
    const KIND: &'static str;
    /// The backend's type name, for `Debug`.
    const NAME: &'static str;
    /// The state every engine has.
    fn common(&self) -> &Common;

    /// [`Backend::capabilities`].
    fn capabilities(&self) -> Capabilities;
    /// One attempt at a shared hold (read lock, permit), within [`Backend::acquire`].
    fn take_share(
        &self,
        take: Take<'_>,
        share: Share,
    ) -> impl Future<Output = Result<Attempt>> + Send;
    /// One attempt at an exclusive hold (mutex, writer), within [`Backend::acquire`].
    fn take_row(&self, take: Take<'_>) -> impl Future<Output = Result<Attempt>> + Send;
    /// Hears of other processes' releases of `name` from now on (within
    /// [`Backend::subscribe`]; this process's own releases wake its waiters at once). An engine
    /// that wakes `waiter` alone (PostgreSQL's wait table) returns the subscription that does,
    /// which the lock's subscription joins.
    fn listen(
        self: &Arc<Self>,
        name: &LockName,
        waiter: Token,
    ) -> impl Future<Output = Result<Option<ReleaseSubscription>>> + Send;
    /// Deletes the row if held with `token` and tells other processes' waiters
    /// ([`Backend::release`]).
    fn release_token(
        &self,
        name: &LockName,
        token: Token,
    ) -> impl Future<Output = Result<Released>> + Send;
    /// Resets the lease if held with `token` ([`Backend::extend`]).
    fn extend_token(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Reads the holder's fence and remaining lease ([`Backend::inspect`]).
    fn inspect_lock(
        &self,
        name: &LockName,
    ) -> impl Future<Output = Result<Option<LockInfo>>> + Send;
    /// Resets the leases of `batch` that are still held ([`Backend::extend_many`]): one
    /// result per entry, in order.
    fn extend_all(&self, batch: Vec<Renewal>) -> impl Future<Output = Result<Vec<bool>>> + Send;
    /// Deletes the row whoever holds it and wakes waiters ([`Backend::force_release`]).
    fn force_delete(&self, name: &LockName) -> impl Future<Output = Result<bool>> + Send;
    /// Gives back the place of a waiting writer, if it took one ([`Backend::leave_queue`]).
    fn leave_place(&self, name: &LockName, token: Token)
        -> impl Future<Output = Result<()>> + Send;
    /// Every held key of `region` ([`Backend::list`]).
    fn held_keys(&self, region: String) -> impl Future<Output = Result<Vec<ListedLock>>> + Send;

    /// The options in force.
    fn options(&self) -> &SqlOptions {
        &self.common().options
    }

    /// `op` on this server with `e`, without the password.
    fn message(&self, op: &str, e: &dyn std::fmt::Display) -> String {
        let c = self.common();
        scrub(format!("{op} on {}: {e}", c.target), c.password.as_deref())
    }

    /// The lock's row: (region, key), the key in Spring's UUID form in Spring mode, once the
    /// region is known to fit the layout.
    fn row_key(&self, name: &LockName) -> Result<(String, String)> {
        let o = self.options();
        if o.shedlock {
            // ShedLock's names have no region: the key alone is the row.
            let prefix = namespace(name.prefix()).to_owned();
            return Ok((prefix, row_name(name.prefix(), name.key())?));
        }
        let region = o.region_of(name);
        check_region(Self::KIND, o.spring, region)?;
        let key = if o.spring {
            spring_lock_key(name.key())
        } else {
            name.key().to_owned()
        };
        Ok((region.to_owned(), key))
    }

    /// The owner column's value for an exclusive hold of `name` by `token`: Spring's UUID
    /// form in Spring mode, else the token's hex (upper case for a writer, see `sql::kinds`).
    fn owner(&self, name: &LockName, token: Token) -> String {
        if self.options().shedlock {
            // The token part of `locked_by` (see `sql::shedlock::locked_by`).
            token.to_string()
        } else if self.options().spring {
            token_uuid(token)
        } else {
            row_owner(name, token)
        }
    }

    /// The region whose locks `list(prefix)` shows (see [`SqlOptions::region_for`]).
    fn list_region(&self, prefix: &str) -> Result<String> {
        let o = self.options();
        if o.shedlock {
            return Ok(namespace(prefix).to_owned());
        }
        let region = o.region_for(prefix);
        check_region(Self::KIND, o.spring, region)?;
        Ok(region.to_owned())
    }

    /// Refuses a kind the layout does not take (Spring mode takes the mutex only).
    fn check_kind(&self, name: &LockName) -> Result<()> {
        let o = self.options();
        if !o.native() && name.kind() != crate::backend::LockKind::Mutex {
            let layout = if o.shedlock {
                "ShedLock's table"
            } else {
                "Spring's INT_LOCK layout"
            };
            return Err(Error::Unsupported {
                backend: Self::KIND,
                what: format!("{} locks in {layout}", name.kind().name()),
            });
        }
        Ok(())
    }
}

impl<E: Engine> LeaseTable<E> {
    /// The options in force.
    pub fn options(&self) -> &SqlOptions {
        self.inner.options()
    }
}

/// Shows the server, user, table and mode, never the password.
impl<E: Engine> std::fmt::Debug for LeaseTable<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.inner.common();
        let o = &c.options;
        f.debug_struct(E::NAME)
            .field("target", &c.target.as_str())
            .field("user", &c.user.as_str())
            .field("table", &o.table)
            .field("schema", &o.schema)
            .field("spring", &o.spring)
            .field("shedlock", &o.shedlock)
            .finish()
    }
}

/// Runs `op` as its own task (see [`detached`]) within `limit`: a caller who gives up midway
/// leaves neither a connection in the middle of a reply nor an outcome nobody records. A
/// timeout names `op` and the server, without the password.
async fn on_own_task<S, T, F, Fut>(
    state: &Arc<S>,
    op: &'static str,
    limit: Duration,
    f: F,
) -> Result<T>
where
    S: Engine,
    T: Send + 'static,
    F: FnOnce(Arc<S>) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    detached(S::KIND, context(state, op), Some(limit), f(state.clone())).await
}

/// The one-row operations run as operations of their own with the backend's time limits; the
/// attempt's undo gives back a lock taken after its caller went away.
#[async_trait::async_trait]
impl<E: Engine> Backend for LeaseTable<E> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (token, lease, queued) = (request.token, request.lease, request.queued());
        let mut described = request.owner_str().to_owned();
        if self.inner.options().shedlock {
            described = locked_by(&described, token);
        }
        let (engine, name) = (self.inner.clone(), request.name.clone());
        let (undo, undo_name) = (self.inner.clone(), name.clone());
        let limit = self.inner.options().request_timeout;
        let attempt = async move {
            engine.check_kind(&name)?;
            let take = Take {
                name: &name,
                token,
                lease,
                queued,
                described: &described,
            };
            match place(&name) {
                Place::Shared(share) => engine.take_share(take, share).await,
                _ => engine.take_row(take).await,
            }
        };
        let named = context(&self.inner, "try_acquire");
        detached_attempt(E::KIND, named, Some(limit), attempt, move || async move {
            let _ = release_waking(&*undo, &undo_name, token).await;
        })
        .await
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let (name, limit) = (name.clone(), self.inner.options().request_timeout);
        on_own_task(&self.inner, "release", limit, move |s| async move {
            release_waking(&*s, &name, token).await
        })
        .await
    }

    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        // Bounded by the lease too: a renewal that answers after the lease ended is no use.
        let (name, limit) = (name.clone(), self.inner.options().renewal_timeout(lease));
        on_own_task(&self.inner, "extend", limit, move |s| async move {
            s.extend_token(&name, token, lease).await
        })
        .await
    }

    /// Within the limit of the batch's shortest lease.
    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        if batch.is_empty() {
            return Vec::new();
        }
        let (batch, count) = (batch.to_vec(), batch.len());
        let limit = batch_timeout(self.inner.options(), &batch);
        let result = on_own_task(&self.inner, "extend_many", limit, move |s| async move {
            s.extend_all(batch).await
        })
        .await;
        per_entry(E::KIND, count, result)
    }

    async fn subscribe(&self, name: &LockName, waiter: Token) -> Result<ReleaseSubscription> {
        let signals = &self.inner.common().signals;
        // Forget the wake-up entries of keys nobody waits for any more (the channel is shared).
        let _ = signals.take_idle(1024);
        let (sub, _) = signals.subscribe(&channel(name));
        Ok(match self.inner.listen(name, waiter).await? {
            Some(own) => sub.merge(own),
            None => sub,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (name, limit) = (name.clone(), self.inner.options().request_timeout);
        on_own_task(&self.inner, "inspect", limit, move |s| async move {
            s.inspect_lock(&name).await
        })
        .await
    }

    /// The fence is kept (native layout).
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let (name, limit) = (name.clone(), self.inner.options().request_timeout);
        on_own_task(&self.inner, "force_release", limit, move |s| async move {
            s.force_delete(&name).await
        })
        .await
    }

    async fn leave_queue(&self, name: &LockName, token: Token) -> Result<()> {
        // Most waiters took no place (they waited for an exclusive holder): nothing to do.
        if !self.inner.common().writers.has(token) {
            return Ok(());
        }
        let (name, limit) = (name.clone(), self.inner.options().request_timeout);
        on_own_task(&self.inner, "leave_queue", limit, move |s| async move {
            s.leave_place(&name, token).await
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let region = self.inner.list_region(prefix)?;
        let limit = self.inner.options().request_timeout;
        on_own_task(&self.inner, "list", limit, move |s| async move {
            s.held_keys(region).await
        })
        .await
    }
}

/// [`Engine::release_token`], waking this process's waiters at once when it released.
async fn release_waking<E: Engine>(engine: &E, name: &LockName, token: Token) -> Result<Released> {
    let released = engine.release_token(name, token).await?;
    if released.was_held {
        engine.common().signals.fire(&channel(name));
    }
    Ok(released)
}

/// Names `op` on this server, for [`detached`]'s timeout message.
pub(crate) fn context<S: Engine>(
    state: &Arc<S>,
    op: &'static str,
) -> impl FnOnce() -> String + Send + 'static {
    let state = state.clone();
    move || {
        let c = state.common();
        scrub(format!("{op} on {}", c.target), c.password.as_deref())
    }
}

/// What a server table promises: release notifications, and fences from the server's clock
/// and every lock kind except in Spring mode (its table has no fence column, and takes the
/// mutex only).
pub(crate) fn capabilities(kind: &'static str, options: &SqlOptions) -> Capabilities {
    let caps = Capabilities::new(kind).notifies_release(true);
    if options.shedlock {
        caps.fencing(Fencing::None)
            .max_key_len(super::shedlock::NAME_CHARS)
    } else if !options.native() {
        caps.fencing(Fencing::None)
    } else {
        caps.fencing(Fencing::MonotonicAcrossDataLoss).all_kinds()
    }
}

/// The limit of a batch renewal: that of its shortest lease.
fn batch_timeout(options: &SqlOptions, batch: &[Renewal]) -> Duration {
    let shortest = batch.iter().map(|r| r.lease).min().unwrap_or_default();
    options.renewal_timeout(shortest)
}
