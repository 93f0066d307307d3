//! PostgreSQL backend: the lease table of the [`sql`](super) module over `tokio-postgres`, with
//! `LISTEN`/`NOTIFY` to wake waiters.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! use distlock::{LockRegistry, RegistryOptions};
//! use distlock::backends::postgres::PostgresBackend;
//! let backend = PostgresBackend::connect("postgres://app:secret@127.0.0.1:5432/app").await?;
//! let registry = LockRegistry::with_options(backend, RegistryOptions::default())?;
//! let guard = registry.obtain("voucher:42")?.lock().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! See the [module docs](super) for the table, the Spring mode and the URL parameters.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{Stream, StreamExt};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Client, Config, Row, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::auth_guard::{AuthGuard, Watch};
use super::dialect::Pg;
use super::{
    channel, duplicate, fence_from, lease_ms, millis, parse_url, scrub, spring_lock_key,
    token_uuid, SqlOptions, ATTEMPTS, WANT_WINDOW_MS,
};
use crate::backend::{
    detached, detached_attempt, AcquireMode, Attempt, Backend, Capabilities, Fencing, LockInfo,
    LockName, ReleaseSignals, ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};

const KIND: &str = "postgres";
/// How often the listening connection is checked.
const LISTENER_CHECK: Duration = Duration::from_secs(30);

/// The messages of a connection (notifications, notices), polled by its driver task.
type Messages =
    Pin<Box<dyn Stream<Item = std::result::Result<AsyncMessage, tokio_postgres::Error>> + Send>>;

/// Why a connection could not be opened.
enum Opening {
    Io(std::io::Error),
    Pg(tokio_postgres::Error),
}

impl fmt::Display for Opening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opening::Io(e) => e.fmt(f),
            Opening::Pg(e) => e.fmt(f),
        }
    }
}
/// The URL schemes of this backend.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// How the connection is encrypted (`sslmode` in the URL), as libpq names it.
///
/// Whatever the mode, a password is sent in a readable form (cleartext or MD5, when the server
/// asks for those) only over TLS whose certificate was verified, unless
/// [`SqlOptions::allow_insecure_auth`] says otherwise; see the
/// [module docs](super#passwords-and-tls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain (the default). The certificate is checked
    /// (against `sslrootcert`, else the Mozilla roots, for the host connected to); one that
    /// does not pass still encrypts, but the connection counts as unverified.
    Prefer,
    /// TLS or fail; the certificate is checked as with `Prefer`, and one that does not pass
    /// still encrypts (as in libpq), but the connection counts as unverified.
    Require,
    /// TLS with a certificate signed by a trusted CA (`sslrootcert`, else the Mozilla roots),
    /// whatever host name it names.
    VerifyCa,
    /// TLS with a trusted certificate for the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::config(format!(
                    "postgres URL: sslmode must be disable, prefer, require, verify-ca or \
                     verify-full, got {other:?}"
                )))
            }
        })
    }
}

/// Statement numbers, for the per-connection cache of prepared statements.
#[derive(Debug, Clone, Copy)]
enum Stmt {
    Acquire = 0,
    AcquireExisting,
    Release,
    Extend,
    ExtendMany,
    Inspect,
    ForceDelete,
}
const STMTS: usize = 7;

/// A pooled connection with its prepared statements.
struct Conn {
    client: Client,
    stmts: [Option<Statement>; STMTS],
    /// The task that drives the connection; aborting it closes the socket at once.
    driver: AbortHandle,
}

struct Pool {
    idle: Mutex<Vec<Conn>>,
    permits: Arc<Semaphore>,
}

/// A connection on loan; it goes back to the pool when dropped unless it broke, or unless a
/// statement was still under way on it (its call ran out of time: the connection may be
/// stalled, and its late reply must never reach the next borrower).
struct Loan<'a> {
    conn: Option<Conn>,
    pool: &'a Pool,
    _permit: OwnedSemaphorePermit,
    in_flight: bool,
}

impl Loan<'_> {
    fn discard(&mut self) {
        self.conn = None;
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.in_flight {
                conn.driver.abort();
            } else if !conn.client.is_closed() {
                self.pool
                    .idle
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(conn);
            }
        }
    }
}

/// The listening connection's state: the generation of the current `LISTEN` (0 while down).
struct ListenerHandle {
    up: watch::Receiver<u64>,
    _stop: oneshot::Sender<()>,
}

struct Inner {
    config: Config,
    transport: Transport,
    /// `host:port/database` for messages.
    target: String,
    user: String,
    password: Option<String>,
    options: SqlOptions,
    sql: Pg,
    pool: Pool,
    ready: tokio::sync::Mutex<bool>,
    ready_fast: AtomicBool,
    signals: ReleaseSignals,
    listener: OnceLock<ListenerHandle>,
    /// The NOTIFY channel of this table.
    listen_channel: String,
    /// Identifies this backend instance in NOTIFY payloads, to skip its own.
    origin: String,
}

/// Locks in a PostgreSQL lease table; see the [module docs](self).
///
/// Cloning is cheap and shares the pool and the listening connection. `Debug` shows the
/// server, database, user and table, never the password.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("PostgresBackend")
            .field("target", &i.target)
            .field("user", &i.user)
            .field("table", &i.options.table)
            .field("schema", &i.options.schema)
            .field("spring", &i.options.spring)
            .finish()
    }
}

impl PostgresBackend {
    /// Connects with a URL: `postgres://[user[:password]@]host[:port][/database][?params]`
    /// (see the [module docs](super) for the parameters). One connection is opened and checked
    /// at once, so that a wrong address or password is reported here.
    pub async fn connect(url: &str) -> Result<Self> {
        let mut parsed = parse_url(KIND, SCHEMES, url)?;
        let mut config = Config::new();
        config.host(&parsed.host);
        config.port(parsed.port.unwrap_or(5432));
        let user = parsed.user.clone().unwrap_or_else(|| "postgres".to_owned());
        config.user(&user);
        if let Some(p) = &parsed.password {
            config.password(p.as_bytes());
        }
        let database = parsed.database.clone().unwrap_or_else(|| user.clone());
        config.dbname(&database);
        config.application_name("distlock");
        let mut ssl = SslMode::Prefer;
        let mut files = TlsFiles::default();
        for (name, value) in std::mem::take(&mut parsed.rest) {
            match name.as_str() {
                "sslmode" => ssl = SslMode::parse(&value)?,
                "sslrootcert" => files.root_cert = Some(value),
                "sslcert" => files.cert = Some(value),
                "sslkey" => files.key = Some(value),
                "application_name" => {
                    config.application_name(&value);
                }
                other => {
                    return Err(Error::config(format!(
                        "postgres URL: unknown query parameter {other:?} (known: table, schema, \
                         region, spring, create_table, pool_size, connect_timeout, \
                         request_timeout, allow_insecure_auth, sslmode, sslrootcert, sslcert, \
                         sslkey, application_name)"
                    )))
                }
            }
        }
        let transport = Transport::new(ssl, &files, parsed.options.allow_insecure_auth)?;
        let target = format!(
            "{}:{}/{}",
            parsed.host,
            parsed.port.unwrap_or(5432),
            database
        );
        Self::with_config(
            config,
            transport,
            target,
            user,
            parsed.password,
            parsed.options,
        )
        .await
    }

    /// Connects with a `tokio-postgres` configuration (its TLS settings are taken from
    /// `sslmode`-like [`SslMode`], verifying against the Mozilla roots) and explicit options.
    /// The first host and port of `config` are used.
    pub async fn connect_with(config: Config, ssl: SslMode, options: SqlOptions) -> Result<Self> {
        options.validate(KIND)?;
        let transport = Transport::new(ssl, &TlsFiles::default(), options.allow_insecure_auth)?;
        let target = format!(
            "{:?}:{:?}/{}",
            config.get_hosts(),
            config.get_ports(),
            config.get_dbname().unwrap_or("")
        );
        let user = config.get_user().unwrap_or("").to_owned();
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        Self::with_config(config, transport, target, user, password, options).await
    }

    async fn with_config(
        mut config: Config,
        transport: Transport,
        target: String,
        user: String,
        password: Option<String>,
        options: SqlOptions,
    ) -> Result<Self> {
        config.ssl_mode(match transport.ssl {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        config.connect_timeout(options.connect_timeout);
        let qualified = format!(
            "{}.{}",
            options.schema.as_deref().unwrap_or(""),
            options.table.to_ascii_lowercase()
        );
        let listen_channel = {
            use md5::{Digest, Md5};
            let d = Md5::digest(qualified.as_bytes());
            let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
            format!("distlock_{hex}")
        };
        let sql = if options.spring {
            Pg::spring(options.schema.as_deref(), &options.table)
        } else {
            Pg::native(options.schema.as_deref(), &options.table)
        };
        let limit = options.connect_timeout + options.request_timeout;
        let backend = PostgresBackend {
            inner: Arc::new(Inner {
                config,
                transport,
                target,
                user,
                password,
                pool: Pool {
                    idle: Mutex::new(Vec::new()),
                    permits: Arc::new(Semaphore::new(options.pool_size)),
                },
                options,
                sql,
                ready: tokio::sync::Mutex::new(false),
                ready_fast: AtomicBool::new(false),
                signals: ReleaseSignals::default(),
                listener: OnceLock::new(),
                listen_channel,
                origin: format!("{:016x}", rand::random::<u64>()),
            }),
        };
        // Open and check one connection now, so that a wrong host or password is reported
        // here, and create the table unless it exists (so the first lock operation does not pay
        // for the DDL).
        let inner = backend.inner.clone();
        detached(
            KIND,
            backend.inner.context("connect"),
            Some(limit),
            async move {
                let mut loan = inner.loan("connect").await?;
                loan.in_flight = true;
                let client = &loan
                    .conn
                    .as_ref()
                    .expect("a loan holds a connection")
                    .client;
                if let Err(e) = inner.ensure_table(client).await {
                    return Err(inner.error("create table", &e));
                }
                loan.in_flight = false;
                Ok(())
            },
        )
        .await?;
        Ok(backend)
    }

    /// The options in force.
    pub fn options(&self) -> &SqlOptions {
        &self.inner.options
    }
}

/// How an error is handled.
enum Class {
    /// The server rolled the statement back: safe to run again.
    RolledBack,
    /// The connection broke; the statement may or may not have run.
    Connection,
    /// The table is missing: create it again, then retry.
    NoTable,
    /// Will not go away by retrying.
    Permanent,
}

fn classify(e: &tokio_postgres::Error) -> Class {
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

impl Inner {
    /// Names `op` on this server, for [`detached`]'s timeout message.
    fn context(self: &Arc<Self>, op: &'static str) -> impl FnOnce() -> String + Send + 'static {
        let inner = self.clone();
        move || {
            scrub(
                format!("{op} on {}", inner.target),
                inner.password.as_deref(),
            )
        }
    }

    fn message(&self, op: &str, e: &dyn fmt::Display) -> String {
        scrub(
            format!("{op} on {}: {e}", self.target),
            self.password.as_deref(),
        )
    }

    fn error(&self, op: &str, e: &tokio_postgres::Error) -> Error {
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
                            self.user
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

    async fn connect_one(&self, op: &str) -> Result<Conn> {
        let refused = Arc::new(AtomicBool::new(false));
        let timeout = self.options.connect_timeout;
        let opened = match tokio::time::timeout(timeout, self.open(refused.clone())).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) if refused.load(Ordering::Acquire) => {
                tracing::debug!(error = %e, "postgres: refused to send the password");
                return Err(self.refused(op));
            }
            Ok(Err(e)) => return Err(self.connect_error(op, e)),
            Err(_) => {
                return Err(Error::unavailable(
                    KIND,
                    self.message(
                        op,
                        &format!("no connection within the connect timeout of {timeout:?}"),
                    ),
                ))
            }
        };
        let (client, mut messages) = opened;
        let driver = tokio::spawn(async move {
            while let Some(m) = messages.next().await {
                if let Err(e) = m {
                    tracing::debug!(error = %e, "postgres connection ended");
                    return;
                }
            }
        });
        Ok(Conn {
            client,
            stmts: Default::default(),
            driver: driver.abort_handle(),
        })
    }

    /// Opens one connection (TCP or a Unix socket, TLS as configured) with the password guard
    /// of [`auth_guard`](super::auth_guard) where the server is not verified. Returns the
    /// client and the connection's messages, which the caller must keep polling.
    async fn open(
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

    fn connect_error(&self, op: &str, e: Opening) -> Error {
        match e {
            Opening::Pg(e) => self.error(op, &e),
            Opening::Io(e) => Error::unavailable(KIND, self.message(op, &e)),
        }
    }

    /// The error of a connection whose server asked for a readable password.
    fn refused(&self, op: &str) -> Error {
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
                    self.user,
                    self.transport.ssl.name()
                ),
            ),
        )
    }

    /// A connection from the pool, or a new one.
    async fn loan(&self, op: &str) -> Result<Loan<'_>> {
        let permit = self
            .pool
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::unavailable(KIND, "the connection pool is closed"))?;
        loop {
            let idle = self
                .pool
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            match idle {
                Some(conn) if conn.client.is_closed() => continue,
                Some(conn) => {
                    return Ok(Loan {
                        conn: Some(conn),
                        pool: &self.pool,
                        _permit: permit,
                        in_flight: false,
                    })
                }
                None => break,
            }
        }
        let conn = self.connect_one(op).await?;
        Ok(Loan {
            conn: Some(conn),
            pool: &self.pool,
            _permit: permit,
            in_flight: false,
        })
    }

    /// Creates the table unless it exists (once per backend, again after it vanished).
    async fn ensure_table(
        &self,
        client: &Client,
    ) -> std::result::Result<(), tokio_postgres::Error> {
        if self.ready_fast.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut ready = self.ready.lock().await;
        if *ready {
            return Ok(());
        }
        let exists: bool = client.query_one(&self.sql.exists, &[]).await?.get(0);
        if !exists && self.options.create_table {
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
        }
        *ready = true;
        self.ready_fast.store(true, Ordering::Release);
        Ok(())
    }

    fn text(&self, s: Stmt) -> &str {
        match s {
            Stmt::Acquire => &self.sql.acquire,
            Stmt::AcquireExisting => self.sql.acquire_existing.as_deref().unwrap_or(""),
            Stmt::Release => &self.sql.release,
            Stmt::Extend => &self.sql.extend,
            Stmt::ExtendMany => &self.sql.extend_many,
            Stmt::Inspect => &self.sql.inspect,
            Stmt::ForceDelete => &self.sql.force_delete,
        }
    }

    async fn run_once(
        &self,
        conn: &mut Conn,
        stmt: Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        self.ensure_table(&conn.client).await?;
        let prepared = match &conn.stmts[stmt as usize] {
            Some(s) => s.clone(),
            None => {
                let s = conn.client.prepare(self.text(stmt)).await?;
                conn.stmts[stmt as usize] = Some(s.clone());
                s
            }
        };
        conn.client.query(&prepared, params).await
    }

    /// Runs one statement, retrying transient failures at once on a fresh connection: always
    /// when the server rolled it back or the connection could not be had, and after a broken
    /// connection only when the statement is `idempotent`.
    async fn query(
        &self,
        op: &'static str,
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
            // Should this call be cut off while the statement is under way, the loan closes
            // the connection instead of giving it back.
            loan.in_flight = true;
            let conn = loan.conn.as_mut().expect("a loan holds a connection");
            let result = self.run_once(conn, stmt, params).await;
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
                        self.ready_fast.store(false, Ordering::Release);
                        *self.ready.lock().await = false;
                        self.pool
                            .idle
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clear();
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

    /// The first two statement parameters for a lock: (region, key) natively, (LOCK_KEY,
    /// REGION) in Spring mode.
    fn ident(&self, name: &LockName) -> Result<(String, String)> {
        let region = self.options.region_of(name);
        super::check_region(KIND, self.options.spring, region)?;
        Ok(if self.options.spring {
            (spring_lock_key(name.key()), region.to_owned())
        } else {
            (region.to_owned(), name.key().to_owned())
        })
    }

    fn owner(&self, token: Token) -> String {
        if self.options.spring {
            token_uuid(token)
        } else {
            token.to_string()
        }
    }

    fn payload(&self, name: &LockName) -> String {
        format!("{}:{}", self.origin, channel(name))
    }

    async fn release_token(&self, name: &LockName, token: Token) -> Result<Released> {
        let (a, b) = self.ident(name)?;
        let owner = self.owner(token);
        let payload = self.payload(name);
        let rows = self
            .query(
                "release",
                Stmt::Release,
                &[&a, &b, &owner, &self.listen_channel, &payload],
                false,
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(Released::default());
        };
        self.signals.fire(&channel(name));
        Ok(Released {
            was_held: true,
            contended: row.get(0),
        })
    }

    /// Starts the listening task once.
    fn listener(self: &Arc<Self>) -> &ListenerHandle {
        self.listener.get_or_init(|| {
            let (up_tx, up) = watch::channel(0u64);
            let (stop, stop_rx) = oneshot::channel();
            tokio::spawn(listen(Arc::downgrade(self), up_tx, stop_rx));
            ListenerHandle { up, _stop: stop }
        })
    }
}

/// Keeps one connection listening on the table's channel, reconnecting when it drops. After a
/// reconnect every waiter is woken, since releases in between were not heard.
async fn listen(weak: Weak<Inner>, up: watch::Sender<u64>, mut stop: oneshot::Receiver<()>) {
    let mut generation = 0u64;
    let mut backoff = Duration::from_millis(10);
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let timeout = inner.options.connect_timeout;
        let request_timeout = inner.options.request_timeout;
        let channel_name = inner.listen_channel.clone();
        let origin = inner.origin.clone();
        let connecting = async move { inner.open(Arc::new(AtomicBool::new(false))).await };
        let connected = tokio::select! {
            r = tokio::time::timeout(timeout, connecting) => r,
            _ = &mut stop => return,
        };
        let (client, mut messages) = match connected {
            Ok(Ok(pair)) => pair,
            other => {
                if let Ok(Err(e)) = other {
                    tracing::debug!(error = %e, "postgres listener cannot connect; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = &mut stop => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let deliver_to = weak.clone();
        let prefix = format!("{origin}:");
        let mut driver = tokio::spawn(async move {
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        let Some(inner) = deliver_to.upgrade() else {
                            return;
                        };
                        let payload = n.payload();
                        // Our own releases fired their local signal already.
                        if !payload.starts_with(&prefix) {
                            if let Some((_, ch)) = payload.split_once(':') {
                                inner.signals.fire(ch);
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "postgres listener connection ended");
                        return;
                    }
                }
            }
        });
        let statement = format!("LISTEN \"{channel_name}\"");
        match tokio::time::timeout(request_timeout, client.batch_execute(&statement)).await {
            Ok(Ok(())) => {}
            other => {
                if let Ok(Err(e)) = other {
                    tracing::debug!(error = %e, "LISTEN failed; reconnecting");
                }
                driver.abort();
                continue;
            }
        }
        backoff = Duration::from_millis(10);
        generation += 1;
        let _ = up.send(generation);
        if generation > 1 {
            if let Some(inner) = weak.upgrade() {
                inner.signals.fire_all();
            }
        }
        // A silent connection (a stalled network, a dead server) is noticed by a periodic
        // query, since releases in between would otherwise go unheard.
        let mut check = tokio::time::interval(LISTENER_CHECK);
        check.tick().await;
        loop {
            tokio::select! {
                _ = &mut driver => break,
                _ = &mut stop => { driver.abort(); return; }
                _ = check.tick() => {
                    let alive = tokio::time::timeout(request_timeout, client.simple_query("SELECT 1"));
                    if !matches!(alive.await, Ok(Ok(_))) {
                        tracing::debug!("postgres listener connection is silent; reconnecting");
                        driver.abort();
                        break;
                    }
                }
            }
        }
        drop(client);
        let _ = up.send(0);
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: if self.inner.options.spring {
                Fencing::None
            } else {
                Fencing::MonotonicAcrossDataLoss
            },
            notifies_release: true,
            fifo: false,
            cross_process: true,
        }
    }

    /// PostgreSQL has no wait queue: both modes make the same attempt. It runs as its own
    /// task; an attempt whose caller went away gives the lock back once it committed.
    async fn acquire(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
        _mode: AcquireMode,
    ) -> Result<Attempt> {
        let inner = self.inner.clone();
        let (undo, undo_name) = (self.inner.clone(), name.clone());
        let name = name.clone();
        let limit = inner.options.request_timeout;
        let attempt = async move {
            let (a, b) = inner.ident(&name)?;
            let owner = inner.owner(token);
            let params: [&(dyn ToSql + Sync); 5] =
                [&a, &b, &owner, &lease_ms(lease), &WANT_WINDOW_MS];
            let mut rows = Vec::new();
            if inner.sql.acquire_existing.is_some() {
                rows = inner
                    .query("try_acquire", Stmt::AcquireExisting, &params, true)
                    .await?;
            }
            if rows.is_empty() {
                rows = inner
                    .query("try_acquire", Stmt::Acquire, &params, true)
                    .await?;
            }
            let Some(row) = rows.first() else {
                return Ok(Attempt::Busy { retry_after: None });
            };
            let (ours, fence, remaining): (bool, i64, i64) = (row.get(0), row.get(1), row.get(2));
            if !ours {
                return Ok(Attempt::Busy {
                    retry_after: Some(millis(remaining)),
                });
            }
            Ok(Attempt::Acquired {
                fence: fence_from(KIND, fence)?,
            })
        };
        let context = self.inner.context("try_acquire");
        detached_attempt(KIND, context, Some(limit), attempt, move || async move {
            let _ = undo.release_token(&undo_name, token).await;
        })
        .await
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let inner = self.inner.clone();
        let name = name.clone();
        let limit = inner.options.request_timeout;
        detached(
            KIND,
            self.inner.context("release"),
            Some(limit),
            async move { inner.release_token(&name, token).await },
        )
        .await
    }

    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let inner = self.inner.clone();
        let name = name.clone();
        // Bounded by the lease too: a renewal that answers after the lease ended is no use.
        let limit = inner.options.renewal_timeout(lease);
        detached(
            KIND,
            self.inner.context("extend"),
            Some(limit),
            async move {
                let (a, b) = inner.ident(&name)?;
                let owner = inner.owner(token);
                let rows = inner
                    .query(
                        "extend",
                        Stmt::Extend,
                        &[&a, &b, &owner, &lease_ms(lease)],
                        true,
                    )
                    .await?;
                Ok(!rows.is_empty())
            },
        )
        .await
    }

    /// All renewals in one `UPDATE … FROM unnest(…)` statement.
    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        if batch.is_empty() {
            return Vec::new();
        }
        let inner = self.inner.clone();
        let batch: Vec<Renewal> = batch.to_vec();
        let count = batch.len();
        let shortest = batch.iter().map(|r| r.lease).min().unwrap_or_default();
        let limit = inner.options.renewal_timeout(shortest);
        let result = detached(
            KIND,
            self.inner.context("extend_many"),
            Some(limit),
            async move {
                let mut a = Vec::with_capacity(batch.len());
                let mut b = Vec::with_capacity(batch.len());
                let mut owners = Vec::with_capacity(batch.len());
                let mut leases = Vec::with_capacity(batch.len());
                let mut entries = Vec::with_capacity(batch.len());
                for r in &batch {
                    match inner.ident(&r.name) {
                        Ok((x, y)) => {
                            let owner = inner.owner(r.token);
                            entries.push(Some((x.clone(), y.clone(), owner.clone())));
                            a.push(x);
                            b.push(y);
                            owners.push(owner);
                            leases.push(lease_ms(r.lease));
                        }
                        Err(_) => entries.push(None),
                    }
                }
                let rows = inner
                    .query(
                        "extend_many",
                        Stmt::ExtendMany,
                        &[&a, &b, &owners, &leases],
                        true,
                    )
                    .await?;
                let extended: HashSet<(String, String, String)> = rows
                    .iter()
                    .map(|r| {
                        (
                            r.get::<_, String>(0),
                            r.get::<_, String>(1),
                            r.get::<_, String>(2),
                        )
                    })
                    .collect();
                Ok(entries
                    .into_iter()
                    .map(|e| e.is_some_and(|k| extended.contains(&k)))
                    .collect::<Vec<bool>>())
            },
        )
        .await;
        match result {
            Ok(v) => v.into_iter().map(Ok).collect(),
            Err(e) => (0..count).map(|_| Err(duplicate(KIND, &e))).collect(),
        }
    }

    /// Listens (once per backend, on a dedicated connection) to the table's channel; returns
    /// when the `LISTEN` is in force, so that no later release is missed. If the listening
    /// connection cannot be had within the connect timeout, the subscription still works from
    /// the moment it comes up (waiters poll meanwhile).
    async fn subscribe(&self, name: &LockName, _waiter: Token) -> Result<ReleaseSubscription> {
        // Forget the wake-up entries of keys nobody waits for any more (the channel is shared).
        let _ = self.inner.signals.take_idle(1024);
        let (sub, _) = self.inner.signals.subscribe(&channel(name));
        let mut up = self.inner.listener().up.clone();
        let timeout = self.inner.options.connect_timeout;
        let _ = tokio::time::timeout(timeout, up.wait_for(|g| *g > 0)).await;
        Ok(sub)
    }

    /// The fence is kept (native layout).
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let inner = self.inner.clone();
        let name = name.clone();
        let limit = inner.options.request_timeout;
        detached(
            KIND,
            self.inner.context("force_release"),
            Some(limit),
            async move {
                let (a, b) = inner.ident(&name)?;
                let payload = inner.payload(&name);
                let rows = inner
                    .query(
                        "force_release",
                        Stmt::ForceDelete,
                        &[&a, &b, &inner.listen_channel, &payload],
                        true,
                    )
                    .await?;
                if !rows.is_empty() {
                    inner.signals.fire(&channel(&name));
                }
                Ok(!rows.is_empty())
            },
        )
        .await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let inner = self.inner.clone();
        let name = name.clone();
        let limit = inner.options.request_timeout;
        detached(
            KIND,
            self.inner.context("inspect"),
            Some(limit),
            async move {
                let (a, b) = inner.ident(&name)?;
                let rows = inner
                    .query("inspect", Stmt::Inspect, &[&a, &b], true)
                    .await?;
                rows.first()
                    .map(|row| {
                        Ok(LockInfo {
                            fence: Some(fence_from(KIND, row.get(0))?),
                            remaining: Some(millis(row.get(1))),
                        })
                    })
                    .transpose()
            },
        )
        .await
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The TLS files named in the URL (libpq's parameter names).
#[derive(Debug, Default)]
struct TlsFiles {
    /// `sslrootcert`: PEM file of the CAs to verify the server against.
    root_cert: Option<String>,
    /// `sslcert` and `sslkey`: the client's certificate chain and key (PEM), for servers that
    /// ask for one (`clientcert=verify-full` or `cert` in `pg_hba.conf`).
    cert: Option<String>,
    key: Option<String>,
}

fn read_certs(path: &str, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let bad = |e: &dyn fmt::Display| Error::config(format!("postgres: bad {what} {path:?}: {e}"));
    CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .map(|c| c.map_err(|e| bad(&e)))
        .collect()
}

/// How new connections are secured, and when a password may go out in a readable form.
struct Transport {
    ssl: SslMode,
    provider: Arc<CryptoProvider>,
    verifier: Arc<WebPkiServerVerifier>,
    client_cert: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    allow_insecure_auth: bool,
}

impl Transport {
    fn new(ssl: SslMode, files: &TlsFiles, allow_insecure_auth: bool) -> Result<Self> {
        let provider = provider();
        let mut roots = rustls::RootCertStore::empty();
        match &files.root_cert {
            Some(path) => {
                for cert in read_certs(path, "sslrootcert")? {
                    roots.add(cert).map_err(|e| {
                        Error::config(format!("postgres: bad certificate in {path:?}: {e}"))
                    })?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| Error::config(format!("postgres: TLS setup: {e}")))?;
        let client_cert = match (&files.cert, &files.key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                use rustls::pki_types::pem::PemObject;
                let chain = read_certs(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| Error::config(format!("postgres: bad sslkey {key:?}: {e}")))?;
                Some((chain, Arc::new(key)))
            }
            _ => {
                return Err(Error::config(
                    "postgres URL: sslcert and sslkey go together (the client certificate and \
                     its key)",
                ))
            }
        };
        Ok(Transport {
            ssl,
            provider,
            verifier,
            client_cert,
            allow_insecure_auth,
        })
    }

    /// The TLS connector of one connection to `host`; it notes whether the server's
    /// certificate passed, and guards the password above TLS when it did not.
    fn connector(&self, host: &str, refused: Arc<AtomicBool>) -> std::io::Result<GuardedTls> {
        let verified = Arc::new(AtomicBool::new(false));
        let builder = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Checked {
                inner: self.verifier.clone(),
                mode: self.ssl,
                verified: verified.clone(),
            }));
        let config = match &self.client_cert {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(std::io::Error::other)?,
            None => builder.with_no_client_auth(),
        };
        let mut make = MakeRustlsConnect::new(config);
        let Ok(tls) = MakeTlsConnect::<Plain>::make_tls_connect(&mut make, host);
        Ok(GuardedTls {
            tls,
            verified,
            allow_insecure_auth: self.allow_insecure_auth,
            refused,
        })
    }
}

/// TLS for one connection, with the password guard on top unless the certificate passed.
struct GuardedTls {
    tls: RustlsConnect,
    verified: Arc<AtomicBool>,
    allow_insecure_auth: bool,
    refused: Arc<AtomicBool>,
}

/// A TCP connection with the password guard below TLS.
type Plain = AuthGuard<tokio::net::TcpStream>;
/// `tokio-postgres-rustls`'s connector (its type is not exported by name).
type RustlsConnect = <MakeRustlsConnect as MakeTlsConnect<Plain>>::TlsConnect;
type TlsOf<S> = <RustlsConnect as TlsConnect<S>>::Stream;

impl<S> TlsConnect<S> for GuardedTls
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    type Stream = AuthGuard<TlsOf<S>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Stream>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let handshake = self.tls.connect(stream);
        Box::pin(async move {
            let stream = handshake.await?;
            let checked = self.allow_insecure_auth || self.verified.load(Ordering::Acquire);
            let watch = if checked { Watch::Off } else { Watch::Messages };
            Ok(AuthGuard::new(stream, watch, self.refused))
        })
    }
}

impl SslMode {
    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Checks the server's certificate against the roots and notes whether it passed. With
/// `verify-ca` and `verify-full` a failure ends the handshake; with `prefer` and `require` the
/// connection stays encrypted but counts as unverified (a passing certificate must also name
/// the host). The handshake signatures are always verified.
#[derive(Debug)]
struct Checked {
    inner: Arc<WebPkiServerVerifier>,
    mode: SslMode,
    verified: Arc<AtomicBool>,
}

impl ServerCertVerifier for Checked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError;
        let outcome =
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            {
                // verify-ca: a trusted chain, whatever name the certificate carries.
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) if self.mode == SslMode::VerifyCa => Ok(ServerCertVerified::assertion()),
                other => other,
            };
        match outcome {
            Ok(v) => {
                self.verified.store(true, Ordering::Release);
                Ok(v)
            }
            Err(e) if matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull) => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "postgres: server certificate not verified");
                Ok(ServerCertVerified::assertion())
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
