//! What the two server backends (PostgreSQL, MySQL/MariaDB) share above their drivers: naming
//! the server in messages without the password, running an operation as its own task (the
//! one-row lock operations whole, around each driver's statements), the owner column's text,
//! the capabilities and a batch's time limit. The drivers differ; this logic did not, and was
//! written twice before.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::kinds::{row_owner, WriterPlaces};
use super::shedlock::{namespace, row_name};
use super::{check_region, per_entry, scrub, spring_lock_key, token_uuid, SqlOptions};
#[cfg(doc)]
use crate::backend::Backend;
use crate::backend::{
    detached, detached_attempt, AcquireRequest, Attempt, Capabilities, Fencing, ListedLock,
    LockInfo, LockName, Released, Renewal, Token,
};
use crate::error::Error;
use crate::error::Result;

/// The state of a server backend, as the shared operation plumbing sees it.
pub(crate) trait Server: Send + Sync + Sized + 'static {
    /// The backend's kind, for errors.
    const KIND: &'static str;
    /// `host:port/database` (no credentials), for messages.
    fn target(&self) -> &str;
    /// The user name.
    fn user(&self) -> &str;
    /// The password, scrubbed from every message.
    fn password(&self) -> Option<&str>;
    /// The options in force.
    fn options(&self) -> &SqlOptions;

    /// `op` on this server with `e`, without the password.
    fn message(&self, op: &str, e: &dyn std::fmt::Display) -> String {
        scrub(format!("{op} on {}: {e}", self.target()), self.password())
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

/// Implements [`Server`] for a backend's state type that has the fields `target: String`,
/// `user: String`, `password: Option<String>` and `options: SqlOptions`, with the backend's kind.
macro_rules! server_state {
    ($state:ty, $kind:expr) => {
        impl $crate::backends::sql::server::Server for $state {
            const KIND: &'static str = $kind;

            fn target(&self) -> &str {
                &self.target
            }

            fn user(&self) -> &str {
                &self.user
            }

            fn password(&self) -> Option<&str> {
                self.password.as_deref()
            }

            fn options(&self) -> &$crate::backends::sql::SqlOptions {
                &self.options
            }
        }
    };
}
pub(crate) use server_state;

/// Implements [`Backend`], `Debug` and `options()` for a server backend: a struct with
/// `inner: Arc<S>`, `S:`
/// [`LockTable`], whose inherent `caps`, `attempt` and `subscribe_waiter` are
/// what its driver does its own way. The one-row operations are the same for every server
/// backend and come from this module.
macro_rules! server_backend {
    ($backend:ty) => {
        impl $backend {
            /// The options in force.
            pub fn options(&self) -> &$crate::backends::sql::SqlOptions {
                &self.inner.options
            }
        }

        /// Shows the server, user, table and mode, never the password.
        impl std::fmt::Debug for $backend {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                $crate::backends::sql::server::debug(&*self.inner, stringify!($backend), f)
            }
        }

        #[async_trait::async_trait]
        impl $crate::backend::Backend for $backend {
            fn capabilities(&self) -> $crate::backend::Capabilities {
                self.caps()
            }

            async fn acquire(
                &self,
                request: &$crate::backend::AcquireRequest,
            ) -> $crate::error::Result<$crate::backend::Attempt> {
                self.attempt(request).await
            }

            async fn release(
                &self,
                name: &$crate::backend::LockName,
                token: $crate::backend::Token,
            ) -> $crate::error::Result<$crate::backend::Released> {
                $crate::backends::sql::server::release(&self.inner, name, token).await
            }

            async fn extend(
                &self,
                name: &$crate::backend::LockName,
                token: $crate::backend::Token,
                lease: std::time::Duration,
            ) -> $crate::error::Result<bool> {
                $crate::backends::sql::server::extend(&self.inner, name, token, lease).await
            }

            async fn extend_many(
                &self,
                batch: &[$crate::backend::Renewal],
            ) -> Vec<$crate::error::Result<bool>> {
                $crate::backends::sql::server::extend_many(&self.inner, batch).await
            }

            async fn subscribe(
                &self,
                name: &$crate::backend::LockName,
                _waiter: $crate::backend::Token,
            ) -> $crate::error::Result<$crate::backend::ReleaseSubscription> {
                self.subscribe_waiter(name).await
            }

            async fn inspect(
                &self,
                name: &$crate::backend::LockName,
            ) -> $crate::error::Result<Option<$crate::backend::LockInfo>> {
                $crate::backends::sql::server::inspect(&self.inner, name).await
            }

            /// The fence is kept (native layout).
            async fn force_release(
                &self,
                name: &$crate::backend::LockName,
            ) -> $crate::error::Result<bool> {
                $crate::backends::sql::server::force_release(&self.inner, name).await
            }

            async fn leave_queue(
                &self,
                name: &$crate::backend::LockName,
                token: $crate::backend::Token,
            ) -> $crate::error::Result<()> {
                $crate::backends::sql::server::leave_queue(&self.inner, name, token).await
            }

            async fn list(
                &self,
                prefix: &str,
            ) -> $crate::error::Result<Vec<$crate::backend::ListedLock>> {
                $crate::backends::sql::server::list(&self.inner, prefix).await
            }
        }
    };
}
pub(crate) use server_backend;

/// The `Debug` of a server backend named `name`: the server, user, table and mode, never the
/// password.
pub(crate) fn debug<S: Server>(
    state: &S,
    name: &str,
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    let o = state.options();
    f.debug_struct(name)
        .field("target", &state.target())
        .field("user", &state.user())
        .field("table", &o.table)
        .field("schema", &o.schema)
        .field("spring", &o.spring)
        .field("shedlock", &o.shedlock)
        .finish()
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
    S: Server,
    T: Send + 'static,
    F: FnOnce(Arc<S>) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    detached(S::KIND, context(state, op), Some(limit), f(state.clone())).await
}

/// A server backend's lock operations that read or change one row: only the statements
/// differ between the drivers; [`release`], [`extend`], [`inspect`] and [`force_release`] run
/// them as operations of their own with the backend's time limits.
pub(crate) trait LockTable: Server {
    /// Deletes the row if held with `token` and wakes waiters ([`Backend::release`]).
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
    /// The waiting writers of this backend that took a place.
    fn places(&self) -> &WriterPlaces;
    /// Gives back the place of a waiting writer, if it took one ([`Backend::leave_queue`]).
    fn leave_place(&self, name: &LockName, token: Token)
        -> impl Future<Output = Result<()>> + Send;
    /// Every held key of `region` ([`Backend::list`]).
    fn held_keys(&self, region: String) -> impl Future<Output = Result<Vec<ListedLock>>> + Send;
}

/// [`Backend::acquire`] of a server backend: `attempt` (the driver's statements, given the
/// state and the lock's name) runs as its own task within the request timeout, and an attempt
/// that took the lock after its caller went away gives it back (see [`detached_attempt`]).
pub(crate) async fn acquire<S, F, Fut>(
    state: &Arc<S>,
    request: &AcquireRequest,
    attempt: F,
) -> Result<Attempt>
where
    S: LockTable,
    F: FnOnce(Arc<S>, LockName) -> Fut,
    Fut: Future<Output = Result<Attempt>> + Send + 'static,
{
    let (name, token) = (request.name.clone(), request.token);
    let (undo, undo_name) = (state.clone(), name.clone());
    let limit = state.options().request_timeout;
    let attempt = attempt(state.clone(), name);
    let named = context(state, "try_acquire");
    detached_attempt(S::KIND, named, Some(limit), attempt, move || async move {
        let _ = undo.release_token(&undo_name, token).await;
    })
    .await
}

/// [`Backend::release`] of a server backend.
pub(crate) async fn release<S: LockTable>(
    state: &Arc<S>,
    name: &LockName,
    token: Token,
) -> Result<Released> {
    let (name, limit) = (name.clone(), state.options().request_timeout);
    on_own_task(state, "release", limit, move |s| async move {
        s.release_token(&name, token).await
    })
    .await
}

/// [`Backend::extend`] of a server backend.
pub(crate) async fn extend<S: LockTable>(
    state: &Arc<S>,
    name: &LockName,
    token: Token,
    lease: Duration,
) -> Result<bool> {
    // Bounded by the lease too: a renewal that answers after the lease ended is no use.
    let (name, limit) = (name.clone(), state.options().renewal_timeout(lease));
    on_own_task(state, "extend", limit, move |s| async move {
        s.extend_token(&name, token, lease).await
    })
    .await
}

/// [`Backend::extend_many`] of a server backend, within the limit of its shortest lease.
pub(crate) async fn extend_many<S: LockTable>(
    state: &Arc<S>,
    batch: &[Renewal],
) -> Vec<Result<bool>> {
    if batch.is_empty() {
        return Vec::new();
    }
    let (batch, count) = (batch.to_vec(), batch.len());
    let limit = batch_timeout(state.options(), &batch);
    let result = on_own_task(state, "extend_many", limit, move |s| async move {
        s.extend_all(batch).await
    })
    .await;
    per_entry(S::KIND, count, result)
}

/// [`Backend::inspect`] of a server backend.
pub(crate) async fn inspect<S: LockTable>(
    state: &Arc<S>,
    name: &LockName,
) -> Result<Option<LockInfo>> {
    let (name, limit) = (name.clone(), state.options().request_timeout);
    on_own_task(state, "inspect", limit, move |s| async move {
        s.inspect_lock(&name).await
    })
    .await
}

/// [`Backend::force_release`] of a server backend.
pub(crate) async fn force_release<S: LockTable>(state: &Arc<S>, name: &LockName) -> Result<bool> {
    let (name, limit) = (name.clone(), state.options().request_timeout);
    on_own_task(state, "force_release", limit, move |s| async move {
        s.force_delete(&name).await
    })
    .await
}

/// [`Backend::leave_queue`] of a server backend.
pub(crate) async fn leave_queue<S: LockTable>(
    state: &Arc<S>,
    name: &LockName,
    token: Token,
) -> Result<()> {
    // Most waiters took no place (they waited for an exclusive holder): nothing to do.
    if !state.places().has(token) {
        return Ok(());
    }
    let (name, limit) = (name.clone(), state.options().request_timeout);
    on_own_task(state, "leave_queue", limit, move |s| async move {
        s.leave_place(&name, token).await
    })
    .await
}

/// [`Backend::list`] of a server backend.
pub(crate) async fn list<S: LockTable>(state: &Arc<S>, prefix: &str) -> Result<Vec<ListedLock>> {
    let (region, limit) = (state.list_region(prefix)?, state.options().request_timeout);
    on_own_task(state, "list", limit, move |s| async move {
        s.held_keys(region).await
    })
    .await
}

/// Names `op` on this server, for [`detached`]'s timeout message.
pub(crate) fn context<S: Server>(
    state: &Arc<S>,
    op: &'static str,
) -> impl FnOnce() -> String + Send + 'static {
    let state = state.clone();
    move || scrub(format!("{op} on {}", state.target()), state.password())
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
