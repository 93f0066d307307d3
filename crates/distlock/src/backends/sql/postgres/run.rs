//! Running statements on the pool: loans, creating the table, the retry rules of
//! `pool::classify`, and turning driver errors into [`Error`]s. Kept apart from `mod.rs`,
//! which holds only what the lock operations mean.

use std::sync::atomic::Ordering;
use std::time::Duration;

use deadpool::managed::PoolError;
use deadpool_postgres::ClientWrapper;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use super::pool::{classify, Class, Loan, Opening, Stmt};
use super::state::{Postgres, KIND};
use crate::backends::sql::lease_table::Engine;
use crate::backends::sql::ATTEMPTS;
use crate::error::{Error, Result};

impl Postgres {
    pub(super) fn error(&self, op: &str, e: &tokio_postgres::Error) -> Error {
        let text = match e.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    text = format!("{text}: {s}");
                    source = s.source();
                }
                text
            }
        };
        match e.code() {
            Some(c)
                if *c == SqlState::INVALID_PASSWORD
                    || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
            {
                Error::backend(
                    KIND,
                    self.message(
                        op,
                        &format!(
                            "authentication failed for user {:?}: wrong password or no access \
                             ({text})",
                            self.common.user
                        ),
                    ),
                )
            }
            _ => match classify(e) {
                Class::RolledBack | Class::Connection => {
                    Error::unavailable(KIND, self.message(op, &text))
                }
                Class::NoTable | Class::Permanent => Error::backend(KIND, self.message(op, &text)),
            },
        }
    }

    pub(super) fn connect_error(&self, op: &str, e: Opening) -> Error {
        match e {
            Opening::Pg(e) => self.error(op, &e),
            Opening::Refused => self.refused(op),
            Opening::Io(_) | Opening::TimedOut(_) => Error::unavailable(KIND, self.message(op, &e)),
        }
    }

    /// The error of a connection whose server asked for a readable password.
    pub(super) fn refused(&self, op: &str) -> Error {
        Error::backend(
            KIND,
            self.message(
                op,
                &format!(
                    "refused to send the password of user {:?}: the server asked for it in \
                     cleartext or as an MD5 digest, over a connection whose server certificate \
                     was not verified (sslmode={}). Verify the server (sslmode=verify-full or \
                     verify-ca with sslrootcert=<CA file>), let the server use \
                     scram-sha-256, or add allow_insecure_auth=true to the URL to send it anyway",
                    self.common.user,
                    self.pool.manager().transport.ssl.name()
                ),
            ),
        )
    }

    /// A connection from the pool, or a new one.
    pub(super) async fn loan(&self, op: &str) -> Result<Loan> {
        match self.pool.get().await {
            Ok(conn) => Ok(Loan {
                conn: Some(conn),
                in_flight: false,
            }),
            Err(PoolError::Backend(e)) => Err(self.connect_error(op, e)),
            Err(PoolError::Closed) => {
                Err(Error::unavailable(KIND, "the connection pool is closed"))
            }
            // Timeouts and hooks are not configured; should one appear, it is not the server's
            // answer and may pass.
            Err(e) => Err(Error::unavailable(KIND, self.message(op, &e))),
        }
    }

    /// Creates the table unless it exists (once per backend, again after it vanished).
    pub(super) async fn ensure_table(
        &self,
        client: &Client,
    ) -> std::result::Result<(), tokio_postgres::Error> {
        if self.common.ready_fast.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut ready = self.common.ready.lock().await;
        if *ready {
            return Ok(());
        }
        let row = client.query_one(&self.sql.exists, &[]).await?;
        let (exists, side) = (row.get::<_, bool>(0), row.get::<_, bool>(1));
        let described = row.get::<_, bool>(2);
        let waits = row.get::<_, bool>(3);
        self.common.side_table.store(side, Ordering::Release);
        if exists && !described && !self.common.options.create_table && self.common.options.native()
        {
            tracing::warn!(
                table = %self.common.options.table,
                "the lease table has no place for holder descriptions (an older layout) and \
                 create_table=false forbids adding it: add it as docs/BACKENDS.md says \
                 (\"Holder descriptions on the SQL backends\"), or statements will fail"
            );
        }
        // A table made before the holders' descriptions were recorded gets their place here.
        if !(exists && side && described && waits) && self.common.options.create_table {
            // A transaction-scoped advisory lock serialises creators (concurrent CREATE TABLE
            // IF NOT EXISTS can fail on the catalog's unique index); it ends with the
            // transaction, so nothing stays on the pooled connection.
            let mut batch = String::from(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('distlock: create lease table'));",
            );
            for s in &self.sql.create {
                batch.push_str(s);
                batch.push(';');
            }
            batch.push_str("COMMIT;");
            if let Err(e) = client.batch_execute(&batch).await {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(e);
            }
            self.common.side_table.store(true, Ordering::Release);
            self.described.store(true, Ordering::Release);
            self.waits.ready.store(true, Ordering::Release);
        } else {
            self.described.store(described, Ordering::Release);
            // Without the wait table (made by an older version, with create_table=false) a
            // release notifies every waiter, as before.
            self.waits.ready.store(waits, Ordering::Release);
        }
        *ready = true;
        self.common.ready_fast.store(true, Ordering::Release);
        Ok(())
    }

    pub(super) fn text(&self, s: Stmt) -> &str {
        match s {
            Stmt::Acquire | Stmt::Release | Stmt::ReleaseNext | Stmt::Inspect | Stmt::List
                if !self.described.load(Ordering::Acquire) =>
            {
                match (&self.sql.undescribed, s) {
                    (Some(u), Stmt::Acquire) => &u.acquire,
                    (Some(u), Stmt::Release) => &u.release,
                    (Some(_), Stmt::ReleaseNext) => {
                        let next = self.sql.waits.release_next_undescribed.as_deref();
                        next.unwrap_or(&self.sql.waits.release_next)
                    }
                    (Some(u), Stmt::Inspect) => &u.inspect,
                    (Some(u), _) => &u.list,
                    (None, _) => self.described_text(s),
                }
            }
            _ => self.described_text(s),
        }
    }

    fn described_text(&self, s: Stmt) -> &str {
        match s {
            Stmt::Acquire => &self.sql.acquire,
            Stmt::AcquireExisting => self.sql.acquire_existing.as_deref().unwrap_or(""),
            Stmt::Release => &self.sql.release,
            Stmt::Extend => &self.sql.extend,
            Stmt::ExtendMany => &self.sql.extend_many,
            Stmt::Inspect => &self.sql.inspect,
            Stmt::ForceDelete => &self.sql.force_delete,
            Stmt::List => &self.sql.list,
            Stmt::NameKey => self.sql.name_key.as_deref().unwrap_or(""),
            Stmt::Register => &self.sql.waits.register,
            Stmt::Unregister => &self.sql.waits.unregister,
            Stmt::ReleaseNext => &self.sql.waits.release_next,
            Stmt::Peek => &self.sql.waits.peek,
            _ => {
                let Some(k) = &self.sql.kinds else { return "" };
                match s {
                    Stmt::Begin => k.begin,
                    Stmt::Commit => k.commit,
                    Stmt::LockRow => &k.lock_row,
                    Stmt::AcquireLone => &k.acquire_lone,
                    Stmt::AcquireShare => &k.acquire_share,
                    Stmt::AcquireShareNow => &k.acquire_share_now,
                    Stmt::ReleaseShare => &k.release_share,
                    Stmt::ReleaseShareNow => &k.release_share_now,
                    Stmt::ExtendShare => &k.extend_share,
                    Stmt::ForceShares => &k.force_delete,
                    Stmt::WriterPlace => &k.writer_place,
                    Stmt::Unplace => &k.unplace,
                    _ => &k.leave,
                }
            }
        }
    }

    pub(super) async fn run_once(
        &self,
        client: &ClientWrapper,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        self.ensure_table(client).await?;
        let prepared = client.prepare_cached(self.text(stmt)).await?;
        client.query(&prepared, params).await
    }

    /// Runs `stmt` in a transaction after `Stmt::LockRow` (see `PgKinds`): `BEGIN`, the lock,
    /// the statement and `COMMIT` in one pipeline, one round trip. The first error is the one
    /// reported (the statements after it only say that the transaction was aborted, and
    /// `COMMIT` then rolls back).
    pub(super) async fn run_locked_once(
        &self,
        client: &ClientWrapper,
        lock: &[&(dyn ToSql + Sync)],
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        self.ensure_table(client).await?;
        let begin = client.prepare_cached(self.text(Stmt::Begin)).await?;
        let lock_row = client.prepare_cached(self.text(Stmt::LockRow)).await?;
        let work = client.prepare_cached(self.text(stmt)).await?;
        let commit = client.prepare_cached(self.text(Stmt::Commit)).await?;
        let (b, l, w, c) = tokio::join!(
            client.query(&begin, &[]),
            client.query(&lock_row, lock),
            client.query(&work, params),
            client.query(&commit, &[]),
        );
        b?;
        l?;
        let rows = w?;
        c?;
        Ok(rows)
    }

    /// Runs one statement, retrying transient failures at once on a fresh connection: always
    /// when the server rolled it back or the connection could not be had, and after a broken
    /// connection only when the statement is `idempotent`.
    pub(super) async fn query(
        &self,
        op: &'static str,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
        idempotent: bool,
    ) -> Result<Vec<Row>> {
        self.run(op, None, stmt, params, idempotent).await
    }

    /// [`query`](Self::query) for a statement that runs after `Stmt::LockRow` with `lock`'s
    /// parameters, in one transaction (see [`run_locked_once`](Self::run_locked_once)).
    pub(super) async fn query_locked(
        &self,
        op: &'static str,
        lock: &[&(dyn ToSql + Sync)],
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
        idempotent: bool,
    ) -> Result<Vec<Row>> {
        self.run(op, Some(lock), stmt, params, idempotent).await
    }

    async fn run(
        &self,
        op: &'static str,
        lock: Option<&[&(dyn ToSql + Sync)]>,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
        idempotent: bool,
    ) -> Result<Vec<Row>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= ATTEMPTS;
            let mut loan = match self.loan(op).await {
                Ok(l) => l,
                Err(e) if e.is_retryable() && !last => {
                    tokio::time::sleep(Duration::from_millis(5 * attempt as u64)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            tracing::trace!(target: "distlock::probe", ev = stmt.probe());
            // Should this call be cut off while the statement is under way, the loan closes
            // the connection instead of giving it back.
            loan.in_flight = true;
            let result = match lock {
                None => self.run_once(loan.client(), stmt, params).await,
                Some(lock) => {
                    self.run_locked_once(loan.client(), lock, stmt, params)
                        .await
                }
            };
            loan.in_flight = false;
            match result {
                Ok(rows) => return Ok(rows),
                Err(e) => {
                    let class = classify(&e);
                    if !matches!(class, Class::Permanent | Class::RolledBack) {
                        loan.discard();
                    }
                    if matches!(class, Class::NoTable) {
                        // Prepared statements of other connections name the old table: drop
                        // them all, and create the table again.
                        self.common.ready_fast.store(false, Ordering::Release);
                        *self.common.ready.lock().await = false;
                        self.pool.retain(|_, _| false);
                    }
                    let retry = match class {
                        Class::RolledBack | Class::NoTable => true,
                        Class::Connection => idempotent,
                        Class::Permanent => false,
                    };
                    drop(loan);
                    if retry && !last {
                        tracing::debug!(op, error = %e, "transient database error; retrying");
                        continue;
                    }
                    return Err(self.error(op, &e));
                }
            }
        }
    }
}
