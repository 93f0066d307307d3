//! One lock cycle (take a free lock, give it back) as the backend's statements and parameters,
//! and run through the backend's pool. Only for the pool comparison of `distlock-bench`
//! (`pg_pool_bench`): it lets another pool run exactly the SQL this backend runs. Hidden from
//! the docs and not part of the API.

use std::time::Duration;

use tokio_postgres::types::ToSql;

use super::pool::Stmt;
use super::PostgresBackend;
use crate::backend::{LockName, Token};
use crate::backends::sql::lease_table::Engine;
use crate::backends::sql::{lease_ms, WANT_WINDOW_MS};
use crate::error::Result;

/// The statements of one acquire-and-release, with their parameters.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct LockCycle {
    /// Run first where the dialect has it; [`acquire`](Self::acquire) only when it returns no
    /// row (as [`Backend::acquire`](crate::Backend::acquire) does).
    pub acquire_existing: Option<String>,
    /// The insert-or-take statement.
    pub acquire: String,
    /// The owner-checked delete, with its notification.
    pub release: String,
    ident: (String, String),
    owner: String,
    lease_ms: i64,
    window_ms: i64,
    channel: String,
    payload: String,
}

impl LockCycle {
    /// The parameters of both acquisition statements.
    pub fn acquire_params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.ident.0,
            &self.ident.1,
            &self.owner,
            &self.lease_ms,
            &self.window_ms,
        ]
    }

    /// The parameters of the release statement.
    pub fn release_params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.ident.0,
            &self.ident.1,
            &self.owner,
            &self.channel,
            &self.payload,
        ]
    }
}

impl PostgresBackend {
    /// The statements and parameters with which this backend takes `name` for `token` and
    /// gives it back.
    #[doc(hidden)]
    pub fn lock_cycle(&self, name: &LockName, token: Token, lease: Duration) -> Result<LockCycle> {
        let inner = &self.inner;
        Ok(LockCycle {
            acquire_existing: inner.sql.acquire_existing.clone(),
            acquire: inner.sql.acquire.clone(),
            release: inner.sql.release.clone(),
            ident: inner.ident(name)?,
            owner: inner.owner(name, token),
            lease_ms: lease_ms(lease),
            window_ms: WANT_WINDOW_MS,
            channel: inner.listen_channel.clone(),
            payload: inner.payload(name),
        })
    }

    /// Runs `cycle` through this backend's pool, one loan per statement as the backend's
    /// operations take them, without the task of its own each operation runs in; `Ok(true)`
    /// when the lock was taken and given back.
    ///
    /// # Cancel safety
    /// Dropped midway, a statement under way closes its connection; the lock may stay taken
    /// until its lease ends.
    #[doc(hidden)]
    pub async fn run_lock_cycle(&self, cycle: &LockCycle) -> Result<bool> {
        let inner = &self.inner;
        let rows = inner.try_take(&cycle.acquire_params()).await?;
        let taken = rows.first().is_some_and(|row| row.get::<_, bool>(0));
        let released = inner
            .query("release", Stmt::Release, &cycle.release_params(), false)
            .await?;
        Ok(taken && !released.is_empty())
    }
}
