//! What the two server backends (PostgreSQL, MySQL/MariaDB) share above their drivers: naming
//! the server in messages without the password, running an operation as its own task, the
//! owner column's text, the capabilities and a batch's time limit. The drivers differ; this
//! logic did not, and was written twice before.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{scrub, token_uuid, SqlOptions};
use crate::backend::{detached, Capabilities, Fencing, Renewal, Token};
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

    /// The owner column's value for `token`: Spring's UUID form in Spring mode.
    fn owner(&self, token: Token) -> String {
        if self.options().spring {
            token_uuid(token)
        } else {
            token.to_string()
        }
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
        .finish()
}

/// Runs `op` as its own task (see [`detached`]) within `limit`: a caller who gives up midway
/// leaves neither a connection in the middle of a reply nor an outcome nobody records. A
/// timeout names `op` and the server, without the password.
pub(crate) async fn on_own_task<S, T, F, Fut>(
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

/// Names `op` on this server, for [`detached`]'s timeout message.
pub(crate) fn context<S: Server>(
    state: &Arc<S>,
    op: &'static str,
) -> impl FnOnce() -> String + Send + 'static {
    let state = state.clone();
    move || scrub(format!("{op} on {}", state.target()), state.password())
}

/// What a server table promises: release notifications, and fences from the server's clock
/// except in Spring mode (its table has no fence column).
pub(crate) fn capabilities(kind: &'static str, options: &SqlOptions) -> Capabilities {
    let fencing = if options.spring {
        Fencing::None
    } else {
        Fencing::MonotonicAcrossDataLoss
    };
    Capabilities::new(kind)
        .fencing(fencing)
        .notifies_release(true)
}

/// The limit of a batch renewal: that of its shortest lease.
pub(crate) fn batch_timeout(options: &SqlOptions, batch: &[Renewal]) -> Duration {
    let shortest = batch.iter().map(|r| r.lease).min().unwrap_or_default();
    options.renewal_timeout(shortest)
}
