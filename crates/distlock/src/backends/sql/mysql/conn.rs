//! Connections and statements: the `ssl-mode` choices, borrowing from the pool (and closing a
//! connection whose statement was cut off), running text or prepared statements with the retry
//! rules of `classify`, and turning driver errors into [`Error`]s. `mod.rs` keeps what the lock
//! operations mean.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use super::state::{Inner, KIND};
use crate::backends::sql::dialect::{MyLock, Prepared};
use crate::backends::sql::doorbell::{outcome, Outcome};
use crate::backends::sql::server::Server;
use crate::backends::sql::{ATTEMPTS, WANT_WINDOW_MS};
use crate::error::{Error, Result};

/// `ssl-mode` in the URL, as MySQL's client names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl SslMode {
    pub(super) fn parse(value: &str) -> Result<Self> {
        Ok(match value.replace('-', "_").as_str() {
            "disabled" => SslMode::Disabled,
            "preferred" => SslMode::Preferred,
            "required" => SslMode::Required,
            "verify_ca" => SslMode::VerifyCa,
            "verify_identity" => SslMode::VerifyIdentity,
            other => {
                return Err(Error::config(format!(
                    "mysql URL: ssl-mode must be disabled, preferred, required, verify_ca or \
                     verify_identity, got {other:?}"
                )))
            }
        })
    }
}

/// How an error is handled.
pub(super) enum Class {
    RolledBack,
    Connection,
    NoTable,
    Permanent,
}

pub(super) fn classify(e: &mysql_async::Error) -> Class {
    match e {
        mysql_async::Error::Server(s) => match s.code {
            // Deadlock victim, lock wait timeout: the statement was rolled back.
            1213 | 1205 | 1040 => Class::RolledBack,
            // Server shutting down, connection killed (MariaDB 1927), query interrupted.
            1053 | 1927 | 1317 | 2006 | 2013 => Class::Connection,
            1146 => Class::NoTable,
            _ => Class::Permanent,
        },
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => Class::Connection,
        _ => Class::Permanent,
    }
}

/// A pooled connection with a statement under way: dropped before the statement finished (the
/// call ran out of time), it is closed, never handed back to the pool, where its late reply
/// would reach the next borrower.
pub(super) struct Borrowed(pub(super) Option<Conn>);

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            discard(conn);
        }
    }
}

/// Closes a connection that may be stalled without waiting for it: `disconnect` marks it
/// disconnected before it writes anything, so when the short wait for the goodbye ends, the
/// socket is dropped and the pool (if it came from one) forgets the connection.
pub(in crate::backends::sql) fn discard(conn: Conn) {
    let close = async move {
        let _ = tokio::time::timeout(Duration::from_millis(100), conn.disconnect()).await;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(close);
        }
        Err(_) => drop(close),
    }
}

/// A statement to run: text (one or more statements), a transaction of several (which
/// closes its connection on any error: statements after a failed one are not run, so the
/// transaction may still be open), or prepared with its values.
#[derive(Clone, Copy)]
pub(super) enum Sql<'a> {
    Text(&'a str),
    Transaction(&'a str),
    Prepared(&'a Prepared, &'a [Value]),
}

pub(super) fn int(row: &Row, i: usize) -> Option<i64> {
    match row.get_opt::<Option<i64>, usize>(i) {
        Some(Ok(v)) => v,
        _ => row
            .get_opt::<Option<String>, usize>(i)
            .and_then(|r| r.ok().flatten())
            .and_then(|s| s.split('.').next().and_then(|n| n.parse().ok())),
    }
}

impl Inner {
    pub(super) fn error(&self, op: &str, e: &mysql_async::Error) -> Error {
        if let mysql_async::Error::Server(s) = e {
            if s.code == 1045 || s.code == 1044 || s.code == 1698 {
                return Error::backend(
                    KIND,
                    self.message(
                        op,
                        &format!(
                            "access denied for user {:?}: wrong password or no access ({} {})",
                            self.user, s.code, s.message
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

    pub(super) async fn conn(&self, op: &str) -> Result<Conn> {
        match tokio::time::timeout(self.options.connect_timeout, self.pool.get_conn()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.error(op, &e)),
            Err(_) => Err(Error::unavailable(
                KIND,
                self.message(
                    op,
                    &format!(
                        "no connection within the connect timeout of {:?}",
                        self.options.connect_timeout
                    ),
                ),
            )),
        }
    }

    pub(super) async fn ensure_table(
        &self,
        conn: &mut Conn,
    ) -> std::result::Result<(), mysql_async::Error> {
        if self.ready_fast.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut ready = self.ready.lock().await;
        if *ready {
            return Ok(());
        }
        let exists: Option<(i64, i64)> = conn
            .query_first(
                self.sql
                    .exists(self.options.schema.as_deref(), &self.options.table),
            )
            .await?;
        let (table, side) = exists.unwrap_or((0, 0));
        self.side_table.store(side > 0, Ordering::Release);
        if (table == 0 || side == 0) && self.options.create_table {
            // CREATE TABLE IF NOT EXISTS is safe when several processes start at once: the
            // data dictionary serialises them and the losers only get a warning.
            conn.query_drop(self.sql.create()).await?;
            self.side_table.store(true, Ordering::Release);
        }
        *ready = true;
        self.ready_fast.store(true, Ordering::Release);
        Ok(())
    }

    pub(super) async fn run_once(
        &self,
        conn: &mut Conn,
        sql: Sql<'_>,
    ) -> std::result::Result<Outcome, mysql_async::Error> {
        self.ensure_table(conn).await?;
        match sql {
            Sql::Text(text) | Sql::Transaction(text) => outcome(conn.query_iter(text).await?).await,
            Sql::Prepared(p, values) => {
                outcome(conn.exec_iter(p.sql.as_str(), values.to_vec()).await?).await
            }
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
            let conn = match self.conn(op).await {
                Ok(c) => c,
                Err(e) if e.is_retryable() && !last => {
                    tokio::time::sleep(Duration::from_millis(5 * attempt as u64)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Should this call be cut off while the statement is under way, the guard closes
            // the connection instead of giving it back to the pool.
            let mut borrowed = Borrowed(Some(conn));
            let result = self
                .run_once(borrowed.0.as_mut().expect("borrowed"), sql)
                .await;
            let conn = borrowed.0.take().expect("borrowed");
            match result {
                Ok(out) => return Ok(out),
                Err(e) => {
                    let class = classify(&e);
                    if matches!(class, Class::Connection) || matches!(sql, Sql::Transaction(_)) {
                        // Do not hand a broken connection back to the pool.
                        discard(conn);
                    } else {
                        drop(conn);
                    }
                    if matches!(class, Class::NoTable) {
                        self.ready_fast.store(false, Ordering::Release);
                        *self.ready.lock().await = false;
                    }
                    let retry = match class {
                        Class::RolledBack | Class::NoTable => true,
                        Class::Connection => idempotent,
                        Class::Permanent => false,
                    };
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
