//! The connection pool: deadpool's managed pool around the backend's own way of opening a
//! connection (through the TLS transport and the auth guard), connections as deadpool-postgres
//! clients with their cache of prepared statements, the statements' names and the classes of
//! errors (the retry rules). Running statements on it is in `run.rs`; this file needs nothing
//! of the backend's state, which holds the pool.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, RecycleError, RecycleResult};
use deadpool_postgres::ClientWrapper;
use futures_util::{Stream, StreamExt};
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, Config};

use super::tls::{SslMode, Transport};
use crate::backends::sql::auth_guard::{AuthGuard, Watch};

/// The messages of a connection (notifications, notices), polled by its driver task.
pub(super) type Messages =
    Pin<Box<dyn Stream<Item = std::result::Result<AsyncMessage, tokio_postgres::Error>> + Send>>;

/// Why a connection could not be opened.
pub(super) enum Opening {
    Io(std::io::Error),
    Pg(tokio_postgres::Error),
    /// The auth guard kept the password back (see [`Postgres::refused`]).
    Refused,
    /// Nothing within the connect timeout.
    TimedOut(Duration),
}

impl fmt::Display for Opening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opening::Io(e) => e.fmt(f),
            Opening::Pg(e) => e.fmt(f),
            Opening::Refused => f.write_str("refused to send the password"),
            Opening::TimedOut(t) => {
                write!(f, "no connection within the connect timeout of {t:?}")
            }
        }
    }
}

/// The statements of the lease table, named for [`Postgres::text`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Stmt {
    Acquire,
    AcquireExisting,
    Release,
    Extend,
    ExtendMany,
    Inspect,
    ForceDelete,
    List,
    NameKey,
    Begin,
    Commit,
    LockRow,
    AcquireLone,
    AcquireShare,
    AcquireShareNow,
    ReleaseShare,
    ReleaseShareNow,
    ExtendShare,
    ForceShares,
    WriterPlace,
    Unplace,
    Leave,
    Register,
    Unregister,
    ReleaseNext,
    Peek,
}

impl Stmt {
    /// The `distlock::probe` event of one statement sent on a pooled connection.
    pub(super) fn probe(self) -> &'static str {
        match self {
            Stmt::Acquire => "pg_sql_acquire",
            Stmt::AcquireExisting => "pg_sql_acquire_existing",
            Stmt::Release => "pg_sql_release",
            Stmt::ReleaseNext => "pg_sql_release_next",
            Stmt::Register => "pg_sql_register",
            Stmt::Unregister => "pg_sql_unregister",
            Stmt::Peek => "pg_sql_peek",
            Stmt::Extend | Stmt::ExtendMany | Stmt::ExtendShare => "pg_sql_extend",
            Stmt::NameKey => "pg_sql_name_key",
            _ => "pg_sql_other",
        }
    }
}

/// The pool: at most `pool_size` connections, the most recently returned lent first (so that
/// a light load keeps few connections busy and the others go idle on the server).
pub(super) type Pool = managed::Pool<Connector>;

/// Opens the pool's connections (and the listening one) the backend's way; deadpool's
/// [`Manager`](managed::Manager) of the pool.
pub(super) struct Connector {
    pub(super) config: Config,
    pub(super) transport: Transport,
    pub(super) connect_timeout: Duration,
}

impl managed::Manager for Connector {
    type Type = ClientWrapper;
    type Error = Opening;

    async fn create(&self) -> std::result::Result<ClientWrapper, Opening> {
        let refused = Arc::new(AtomicBool::new(false));
        let timeout = self.connect_timeout;
        let (client, mut messages) =
            match tokio::time::timeout(timeout, self.open(refused.clone())).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(e)) if refused.load(Ordering::Acquire) => {
                    tracing::debug!(error = %e, "postgres: refused to send the password");
                    return Err(Opening::Refused);
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Opening::TimedOut(timeout)),
            };
        let driver = tokio::spawn(async move {
            while let Some(m) = messages.next().await {
                if let Err(e) = m {
                    tracing::debug!(error = %e, "postgres connection ended");
                    return;
                }
            }
        });
        // The wrapper aborts the driver when dropped, which closes the socket at once.
        Ok(ClientWrapper::new(client, driver))
    }

    /// Only the free check: a connection that broke since is replaced; one that is merely
    /// slow is found out by the statement's time limit, which closes it.
    async fn recycle(&self, client: &mut ClientWrapper, _: &Metrics) -> RecycleResult<Opening> {
        if client.is_closed() {
            return Err(RecycleError::message("connection closed"));
        }
        Ok(())
    }
}

impl Connector {
    /// Opens one connection (TCP or a Unix socket, TLS as configured) with the password guard
    /// of [`auth_guard`](crate::backends::sql::auth_guard) where the server is not verified. Returns the
    /// client and the connection's messages, which the caller must keep polling.
    pub(super) async fn open(
        &self,
        refused: Arc<AtomicBool>,
    ) -> std::result::Result<(Client, Messages), Opening> {
        let host = self.config.get_hosts().first().cloned();
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        match host {
            Some(Host::Tcp(host)) => {
                let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
                    .await
                    .map_err(Opening::Io)?;
                let _ = tcp.set_nodelay(true);
                let t = &self.transport;
                let below = match t.ssl {
                    _ if t.allow_insecure_auth => Watch::Off,
                    SslMode::Disable => Watch::Messages,
                    _ => Watch::SslReply,
                };
                let stream = AuthGuard::new(tcp, below, refused.clone());
                let tls = t.connector(&host, refused).map_err(Opening::Io)?;
                let (client, mut connection) = self
                    .config
                    .connect_raw(stream, tls)
                    .await
                    .map_err(Opening::Pg)?;
                let messages: Messages = Box::pin(futures_util::stream::poll_fn(move |cx| {
                    connection.poll_message(cx)
                }));
                Ok((client, messages))
            }
            #[cfg(unix)]
            Some(Host::Unix(dir)) => {
                // A local socket: nothing to intercept, no TLS (as libpq).
                let path = dir.join(format!(".s.PGSQL.{port}"));
                let unix = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(Opening::Io)?;
                let mut config = self.config.clone();
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                let (client, mut connection) = config
                    .connect_raw(unix, tokio_postgres::NoTls)
                    .await
                    .map_err(Opening::Pg)?;
                let messages: Messages = Box::pin(futures_util::stream::poll_fn(move |cx| {
                    connection.poll_message(cx)
                }));
                Ok((client, messages))
            }
            _ => Err(Opening::Io(std::io::Error::other("no host to connect to"))),
        }
    }
}

/// A connection on loan; it goes back to the pool when dropped unless it broke, or unless a
/// statement was still under way on it (its call ran out of time: the connection may be
/// stalled, and its late reply must never reach the next borrower).
pub(super) struct Loan {
    pub(super) conn: Option<Object<Connector>>,
    pub(super) in_flight: bool,
}

impl Loan {
    pub(super) fn client(&self) -> &ClientWrapper {
        self.conn
            .as_ref()
            .expect("a loan holds a connection until dropped")
    }

    /// Closes the connection instead of giving it back.
    pub(super) fn discard(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if self.in_flight {
            self.discard();
        }
    }
}

/// How an error is handled.
pub(super) enum Class {
    /// The server rolled the statement back: safe to run again.
    RolledBack,
    /// The connection broke; the statement may or may not have run.
    Connection,
    /// The table is missing: create it again, then retry.
    NoTable,
    /// Will not go away by retrying.
    Permanent,
}

pub(super) fn classify(e: &tokio_postgres::Error) -> Class {
    match e.code() {
        Some(c)
            if *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::LOCK_NOT_AVAILABLE
                || *c == SqlState::TOO_MANY_CONNECTIONS
                || *c == SqlState::CANNOT_CONNECT_NOW =>
        {
            Class::RolledBack
        }
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || c.code().starts_with("08") =>
        {
            Class::Connection
        }
        Some(c) if *c == SqlState::UNDEFINED_TABLE => Class::NoTable,
        Some(_) => Class::Permanent,
        None => Class::Connection,
    }
}
