//! Statements: creating the table, running text or prepared statements on the sessions with
//! the retry rules of `driver::classify`, and turning driver errors into [`Error`]s. `mod.rs` and `acquire.rs` keep what the lock operations mean.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mysql_async::Value;

use super::driver::{classify, int, Class, Sql};
use super::session::{Failed, Job, Outcome};
use super::state::{MySql, KIND};
use crate::backends::sql::dialect::{MyLock, Prepared};
use crate::backends::sql::lease_table::Engine;
use crate::backends::sql::{ATTEMPTS, WANT_WINDOW_MS};
use crate::error::{Error, Result};

/// ER_DUP_FIELDNAME: the column exists already.
const DUPLICATE_COLUMN: u16 = 1060;

impl MySql {
    pub(super) fn error(&self, op: &str, e: &mysql_async::Error) -> Error {
        if let mysql_async::Error::Server(s) = e {
            if s.code == 1045 || s.code == 1044 || s.code == 1698 {
                return Error::backend(
                    KIND,
                    self.message(
                        op,
                        &format!(
                            "access denied for user {:?}: wrong password or no access ({} {})",
                            self.common.user, s.code, s.message
                        ),
                    ),
                );
            }
        }
        // rustls reports a certificate it rejects as invalid data; retrying will not help.
        let tls = match e {
            mysql_async::Error::Io(mysql_async::IoError::Tls(t)) => Some(t.to_string()),
            mysql_async::Error::Io(mysql_async::IoError::Io(io))
                if io.kind() == std::io::ErrorKind::InvalidData
                    && io.to_string().contains("certificate") =>
            {
                Some(io.to_string())
            }
            _ => None,
        };
        if let Some(t) = tls {
            return Error::backend(
                KIND,
                self.message(
                    op,
                    &format!(
                        "TLS failed (a certificate that cannot be verified needs ssl-ca=<CA \
                         file>, or ssl-mode=required for encryption without verification): {t}"
                    ),
                ),
            );
        }
        match classify(e) {
            Class::RolledBack | Class::Connection => Error::unavailable(KIND, self.message(op, e)),
            Class::NoTable | Class::Permanent => Error::backend(KIND, self.message(op, e)),
        }
    }

    /// Creates the lease table (and the side table) unless they exist, once per backend; the
    /// first call also opens the session's connection, so that a wrong address or password
    /// is reported by `connect`.
    pub(super) async fn ensure_table(&self) -> std::result::Result<(), Failed> {
        if self.common.ready_fast.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut ready = self.common.ready.lock().await;
        if *ready {
            return Ok(());
        }
        let exists = self.sql.exists(
            self.common.options.schema.as_deref(),
            &self.common.options.table,
        );
        let out = self.doorbells.run(Job::Text(exists)).await?;
        let row = out.rows.first();
        let n = |i| row.and_then(|r| int(r, i)).unwrap_or(0);
        let (table, side) = (n(0), n(1));
        self.common.side_table.store(side > 0, Ordering::Release);
        if self.common.options.spring {
            self.sql
                .set_described(n(2) > 0 || self.common.options.create_table);
        }
        if table > 0
            && (n(2) == 0 || n(3) == 0)
            && !self.common.options.create_table
            && self.common.options.native()
        {
            tracing::warn!(
                table = %self.common.options.table,
                "the lease table has no place for holder descriptions (an older layout) and \
                 create_table=false forbids adding it: add it as docs/BACKENDS.md says \
                 (\"Holder descriptions on the SQL backends\"), or statements will fail"
            );
        }
        if (table == 0 || side == 0 || n(2) == 0 || n(3) == 0) && self.common.options.create_table {
            // CREATE TABLE IF NOT EXISTS is safe when several processes start at once: the
            // data dictionary serialises them and the losers only get a warning.
            self.doorbells.run(Job::Text(self.sql.create())).await?;
            self.common.side_table.store(true, Ordering::Release);
            if self.common.options.native() {
                // Tables made before the holders' descriptions were recorded.
                for (i, side) in [(2, false), (3, true)] {
                    let existed = if side { n(1) > 0 } else { table > 0 };
                    if existed && n(i) == 0 {
                        self.add_owner_column(side).await?;
                    }
                }
            }
        }
        *ready = true;
        self.common.ready_fast.store(true, Ordering::Release);
        Ok(())
    }

    /// Adds the `owner` column to a table made before it existed; another process doing the
    /// same at once is no failure (the column is there either way).
    async fn add_owner_column(&self, side: bool) -> std::result::Result<(), Failed> {
        match self
            .doorbells
            .run(Job::Text(self.sql.add_owner_column(side)))
            .await
        {
            Err(Failed {
                error: mysql_async::Error::Server(e),
                ..
            }) if e.code == DUPLICATE_COLUMN => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// The release statement of the layout, without a doorbell.
    pub(super) async fn release_plain(&self, lock: &MyLock<'_>) -> Result<Outcome> {
        if !self.common.options.native() {
            self.run("release", &self.sql.release(lock), false).await
        } else {
            self.run_prepared("release", &self.release_prepared, lock, 0, false)
                .await
        }
    }

    /// Runs `sql` (one or more statements, autocommit), retrying transient failures at once
    /// on another connection: always when the server rolled it back or no connection could be
    /// had, and after a broken connection only when `idempotent`.
    pub(super) async fn run(
        &self,
        op: &'static str,
        sql: &str,
        idempotent: bool,
    ) -> Result<Outcome> {
        self.run_sql(op, Sql::Text(sql), idempotent).await
    }

    /// [`run`](Self::run) for a transaction of several statements (see [`Sql::Transaction`]).
    pub(super) async fn run_transaction(
        &self,
        op: &'static str,
        sql: &str,
        idempotent: bool,
    ) -> Result<Outcome> {
        self.run_sql(op, Sql::Transaction(sql), idempotent).await
    }

    /// [`run`](Self::run) for a prepared statement (see [`Prepared`]) and its values.
    pub(super) async fn run_prepared(
        &self,
        op: &'static str,
        p: &Prepared,
        lock: &MyLock<'_>,
        lease_ms: i64,
        idempotent: bool,
    ) -> Result<Outcome> {
        let values: Vec<Value> = p
            .names
            .iter()
            .map(|n| match *n {
                "region" => Value::Bytes(lock.region.as_bytes().to_vec()),
                "key" => Value::Bytes(lock.key.as_bytes().to_vec()),
                "tok" => Value::Bytes(lock.token.as_bytes().to_vec()),
                "lease" => Value::Int(lease_ms),
                "want" => Value::Int(WANT_WINDOW_MS),
                "half" => Value::Int(WANT_WINDOW_MS / 2),
                "own" => Value::Bytes(lock.described.as_bytes().to_vec()),
                other => unreachable!("no value for `{other}`"),
            })
            .collect();
        self.run_sql(op, Sql::Prepared(p, &values), idempotent)
            .await
    }

    pub(super) async fn run_sql(
        &self,
        op: &'static str,
        sql: Sql<'_>,
        idempotent: bool,
    ) -> Result<Outcome> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= ATTEMPTS;
            let job = match sql {
                Sql::Text(t) => Job::Text(t.to_owned()),
                Sql::Transaction(t) => Job::Transaction(t.to_owned()),
                Sql::Prepared(p, values) => Job::Prepared(p.sql.clone(), values.to_vec()),
            };
            tracing::trace!(target: "distlock::probe", ev = probe_name(op));
            let result = match self.ensure_table().await {
                Ok(()) => self.doorbells.run(job).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(out) => return Ok(out),
                Err(Failed { error: e, sent }) => {
                    let class = classify(&e);
                    if matches!(class, Class::NoTable) {
                        self.common.ready_fast.store(false, Ordering::Release);
                        *self.common.ready.lock().await = false;
                    }
                    let retry = match class {
                        Class::RolledBack | Class::NoTable => true,
                        // Nothing was sent when no connection could be had.
                        Class::Connection => idempotent || !sent,
                        Class::Permanent => false,
                    };
                    if retry && !last {
                        tracing::debug!(op, error = %e, "transient database error; retrying");
                        if !sent {
                            tokio::time::sleep(Duration::from_millis(5 * attempt as u64)).await;
                        }
                        continue;
                    }
                    return Err(self.error(op, &e));
                }
            }
        }
    }
}

/// The probe event of a statement run for `op` (see `distlock::probe`).
fn probe_name(op: &str) -> &'static str {
    match op {
        "try_acquire" => "my_sql_acquire",
        "release" => "my_sql_release",
        "leave_queue" => "my_sql_leave_queue",
        "extend" | "extend_many" => "my_sql_extend",
        _ => "my_sql_other",
    }
}
