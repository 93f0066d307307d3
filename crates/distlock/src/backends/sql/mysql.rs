//! MySQL / MariaDB backend: the lease table of the [`sql`](super) module over `mysql_async`.
//! MySQL has no release notification: waiters poll (the registry does that, jittered, soon at
//! first and backing off); releases made through this backend wake waiters of the same
//! process at once.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! use distlock::LockRegistry;
//! use distlock::backends::mysql::MySqlBackend;
//! let backend = MySqlBackend::connect("mysql://app:secret@127.0.0.1:3306/app").await?;
//! let registry = LockRegistry::new(backend);
//! let guard = registry.obtain("voucher:42")?.lock().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Every statement runs in autocommit mode and leaves no session state behind (see the
//! [module docs](super)), so connections go back to the pool without a reset round trip.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder, Pool, PoolConstraints, PoolOpts, Row, SslOpts};

use super::dialect::{My, MyLock};
use super::{
    channel, fence_from, lease_ms, millis, parse_url, scrub, spring_lock_key, token_uuid,
    SqlOptions, ATTEMPTS, WANT_WINDOW_MS,
};
use crate::backend::{
    Attempt, Backend, Capabilities, Fencing, LockInfo, LockName, ReleaseSignals,
    ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};

const KIND: &str = "mysql";
/// The URL schemes of this backend.
pub const SCHEMES: &[&str] = &["mysql", "mariadb"];
/// Renewals per `UPDATE` statement in [`Backend::extend_many`] (one commit each).
const BATCH: usize = 2500;

struct Inner {
    pool: Pool,
    target: String,
    user: String,
    password: Option<String>,
    options: SqlOptions,
    sql: My,
    ready: tokio::sync::Mutex<bool>,
    ready_fast: AtomicBool,
    signals: ReleaseSignals,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let pool = self.pool.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = pool.disconnect().await;
            });
        }
    }
}

/// Locks in a MySQL or MariaDB lease table; see the [module docs](self).
///
/// Cloning is cheap and shares the pool. `Debug` never shows the password.
#[derive(Clone)]
pub struct MySqlBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for MySqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("MySqlBackend")
            .field("target", &i.target)
            .field("user", &i.user)
            .field("table", &i.options.table)
            .field("schema", &i.options.schema)
            .field("spring", &i.options.spring)
            .finish()
    }
}

/// How an error is handled.
enum Class {
    RolledBack,
    Connection,
    NoTable,
    Permanent,
}

fn classify(e: &mysql_async::Error) -> Class {
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

impl MySqlBackend {
    /// Connects with a URL: `mysql://[user[:password]@]host[:port][/database][?params]`
    /// (`mariadb://` too; see the [module docs](super) for the parameters). One connection is
    /// opened and checked at once, so that a wrong address or password is reported here.
    pub async fn connect(url: &str) -> Result<Self> {
        let parsed = parse_url(KIND, SCHEMES, url)?;
        let mut ssl_mode = "disabled".to_owned();
        let mut ssl_ca = None;
        for (name, value) in &parsed.rest {
            match name.as_str() {
                "ssl-mode" | "ssl_mode" | "sslmode" => ssl_mode = value.to_ascii_lowercase(),
                "ssl-ca" | "ssl_ca" => ssl_ca = Some(value.clone()),
                other => {
                    return Err(Error::config(format!(
                        "mysql URL: unknown query parameter {other:?} (known: table, schema, \
                         region, spring, create_table, pool_size, connect_timeout, ssl-mode, \
                         ssl-ca)"
                    )))
                }
            }
        }
        let ssl = match ssl_mode.replace('-', "_").as_str() {
            "disabled" | "preferred" => None,
            "required" => Some(
                SslOpts::default()
                    .with_danger_accept_invalid_certs(true)
                    .with_danger_skip_domain_validation(true),
            ),
            "verify_ca" => Some(SslOpts::default().with_danger_skip_domain_validation(true)),
            "verify_identity" => Some(SslOpts::default()),
            other => {
                return Err(Error::config(format!(
                    "mysql URL: ssl-mode must be disabled, preferred, required, verify_ca or \
                     verify_identity, got {other:?}"
                )))
            }
        };
        let ssl = ssl.map(|s| match &ssl_ca {
            Some(path) => s
                .with_root_certs(vec![std::path::PathBuf::from(path).into()])
                .with_disable_built_in_roots(true),
            None => s,
        });
        let user = parsed.user.clone().unwrap_or_else(|| "root".to_owned());
        let port = parsed.port.unwrap_or(3306);
        let target = format!(
            "{}:{port}/{}",
            parsed.host,
            parsed.database.as_deref().unwrap_or("")
        );
        let builder = OptsBuilder::default()
            .ip_or_hostname(parsed.host.clone())
            .tcp_port(port)
            .user(Some(user.clone()))
            .pass(parsed.password.clone())
            .db_name(parsed.database.clone())
            .ssl_opts(ssl);
        Self::connect_with(builder, user, parsed.password, target, parsed.options).await
    }

    /// Connects with `mysql_async` options and explicit [`SqlOptions`]; the pool settings
    /// (size, no reset on return, found-rows counting) are set from `options`.
    pub async fn connect_with_opts(builder: OptsBuilder, options: SqlOptions) -> Result<Self> {
        let opts = mysql_async::Opts::from(builder.clone());
        let user = opts.user().unwrap_or("").to_owned();
        let password = opts.pass().map(str::to_owned);
        let target = format!(
            "{}:{}/{}",
            opts.ip_or_hostname(),
            opts.tcp_port(),
            opts.db_name().unwrap_or("")
        );
        Self::connect_with(builder, user, password, target, options).await
    }

    async fn connect_with(
        builder: OptsBuilder,
        user: String,
        password: Option<String>,
        target: String,
        options: SqlOptions,
    ) -> Result<Self> {
        options.validate(KIND)?;
        let constraints = PoolConstraints::new(0, options.pool_size)
            .ok_or_else(|| Error::config("mysql: bad pool size"))?;
        let builder = builder
            .client_found_rows(true)
            .tcp_nodelay(true)
            .prefer_socket(false)
            .pool_opts(
                PoolOpts::default()
                    .with_constraints(constraints)
                    // Idle connections stay for a minute (the default closes them at once).
                    .with_inactive_connection_ttl(Duration::from_secs(60))
                    .with_reset_connection(false),
            );
        let backend = MySqlBackend {
            inner: Arc::new(Inner {
                pool: Pool::new(builder),
                target,
                user,
                password,
                sql: My::new(options.schema.as_deref(), &options.table, options.spring),
                options,
                ready: tokio::sync::Mutex::new(false),
                ready_fast: AtomicBool::new(false),
                signals: ReleaseSignals::default(),
            }),
        };
        // Check one connection now (a wrong host or password is reported here) and create the
        // table unless it exists, so that the first lock operation does not pay for the DDL.
        let mut conn = backend.inner.conn("connect").await?;
        if let Err(e) = backend.inner.ensure_table(&mut conn).await {
            return Err(backend.inner.error("create table", &e));
        }
        drop(conn);
        Ok(backend)
    }

    /// The options in force.
    pub fn options(&self) -> &SqlOptions {
        &self.inner.options
    }

    /// Frees a lock whoever holds it, as an operator (or a fault) would; the fence is kept
    /// (native layout). Returns whether a live hold existed.
    pub async fn force_delete(&self, name: &LockName) -> Result<bool> {
        let inner = self.inner.clone();
        let name = name.clone();
        spawn(async move {
            let (a, b) = inner.ident(&name)?;
            let sql = inner.sql.force_delete(&MyLock {
                region: &a,
                key: &b,
                token: "",
            });
            let out = inner.run("force_delete", &sql, true).await?;
            if out.affected > 0 {
                inner.signals.fire(&channel(&name));
            }
            Ok(out.affected > 0)
        })
        .await
    }
}

async fn spawn<T: Send + 'static>(
    fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(fut).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => Err(Error::backend(KIND, "the database task panicked")),
        Err(_) => Err(Error::unavailable(
            KIND,
            "the database task was cancelled (runtime shutting down)",
        )),
    }
}

/// What a multi-statement query returned: the affected rows of the first statement and the
/// rows of the last result set that had any.
struct Outcome {
    affected: u64,
    rows: Vec<Row>,
}

fn int(row: &Row, i: usize) -> Option<i64> {
    match row.get_opt::<Option<i64>, usize>(i) {
        Some(Ok(v)) => v,
        _ => row
            .get_opt::<Option<String>, usize>(i)
            .and_then(|r| r.ok().flatten())
            .and_then(|s| s.split('.').next().and_then(|n| n.parse().ok())),
    }
}

impl Inner {
    fn message(&self, op: &str, e: &dyn fmt::Display) -> String {
        scrub(
            format!("{op} on {}: {e}", self.target),
            self.password.as_deref(),
        )
    }

    fn error(&self, op: &str, e: &mysql_async::Error) -> Error {
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
        match classify(e) {
            Class::RolledBack | Class::Connection => Error::unavailable(KIND, self.message(op, e)),
            Class::NoTable | Class::Permanent => Error::backend(KIND, self.message(op, e)),
        }
    }

    async fn conn(&self, op: &str) -> Result<Conn> {
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

    async fn ensure_table(&self, conn: &mut Conn) -> std::result::Result<(), mysql_async::Error> {
        if self.ready_fast.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut ready = self.ready.lock().await;
        if *ready {
            return Ok(());
        }
        let exists: Option<i64> = conn
            .query_first(
                self.sql
                    .exists(self.options.schema.as_deref(), &self.options.table),
            )
            .await?;
        if exists.unwrap_or(0) == 0 && self.options.create_table {
            // CREATE TABLE IF NOT EXISTS is safe when several processes start at once: the
            // data dictionary serialises them and the losers only get a warning.
            conn.query_drop(self.sql.create()).await?;
        }
        *ready = true;
        self.ready_fast.store(true, Ordering::Release);
        Ok(())
    }

    async fn run_once(
        &self,
        conn: &mut Conn,
        sql: &str,
    ) -> std::result::Result<Outcome, mysql_async::Error> {
        self.ensure_table(conn).await?;
        let mut result = conn.query_iter(sql).await?;
        let affected = result.affected_rows();
        let mut rows = Vec::new();
        loop {
            let set: Vec<Row> = result.collect().await?;
            if !set.is_empty() {
                rows = set;
            }
            if result.is_empty() {
                break;
            }
        }
        Ok(Outcome { affected, rows })
    }

    /// Runs `sql` (one or more statements, autocommit), retrying transient failures at once
    /// on another connection: always when the server rolled it back or no connection could be
    /// had, and after a broken connection only when `idempotent`.
    async fn run(&self, op: &'static str, sql: &str, idempotent: bool) -> Result<Outcome> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= ATTEMPTS;
            let mut conn = match self.conn(op).await {
                Ok(c) => c,
                Err(e) if e.is_retryable() && !last => {
                    tokio::time::sleep(Duration::from_millis(5 * attempt as u64)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match self.run_once(&mut conn, sql).await {
                Ok(out) => return Ok(out),
                Err(e) => {
                    let class = classify(&e);
                    if matches!(class, Class::Connection) {
                        // Do not hand a broken connection back to the pool.
                        let _ = tokio::time::timeout(Duration::from_millis(100), conn.disconnect())
                            .await;
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

    /// (region, key) natively, (REGION, LOCK_KEY) in Spring mode.
    fn ident(&self, name: &LockName) -> Result<(String, String)> {
        let region = self.options.region_of(name);
        super::check_region(KIND, self.options.spring, region)?;
        Ok(if self.options.spring {
            (region.to_owned(), spring_lock_key(name.key()))
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

    async fn release_token(&self, name: &LockName, token: Token) -> Result<Released> {
        let (a, b) = self.ident(name)?;
        let owner = self.owner(token);
        let sql = self.sql.release(&MyLock {
            region: &a,
            key: &b,
            token: &owner,
        });
        let out = self.run("release", &sql, false).await?;
        let row = out.rows.first();
        let was_held = row.and_then(|r| int(r, 0)).unwrap_or(0) > 0;
        if !was_held {
            return Ok(Released::default());
        }
        self.signals.fire(&channel(name));
        Ok(Released {
            was_held,
            contended: row.and_then(|r| int(r, 1)).unwrap_or(0) > 0,
        })
    }
}

/// A committed acquisition on its way back to the caller; given back at once if the caller
/// stopped waiting (see the PostgreSQL backend).
struct Acquisition {
    inner: Arc<Inner>,
    undo: Option<(LockName, Token)>,
}

impl Acquisition {
    fn delivered(mut self) {
        self.undo = None;
    }
}

impl Drop for Acquisition {
    fn drop(&mut self) {
        if let Some((name, token)) = self.undo.take() {
            let inner = self.inner.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = inner.release_token(&name, token).await;
                });
            }
        }
    }
}

#[async_trait]
impl Backend for MySqlBackend {
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
            notifies_release: false,
            fifo: false,
            cross_process: true,
        }
    }

    async fn try_acquire(&self, name: &LockName, token: Token, lease: Duration) -> Result<Attempt> {
        let inner = self.inner.clone();
        let name = name.clone();
        let (attempt, hold) = spawn(async move {
            let (a, b) = inner.ident(&name)?;
            let owner = inner.owner(token);
            let lock = MyLock {
                region: &a,
                key: &b,
                token: &owner,
            };
            let mut out = None;
            if let Some(sql) = inner
                .sql
                .acquire_existing(&lock, lease_ms(lease), WANT_WINDOW_MS)
            {
                out = Some(inner.run("try_acquire", &sql, true).await?);
            }
            let out = match out {
                Some(o) if !o.rows.is_empty() => o,
                _ => {
                    let sql = inner.sql.acquire(&lock, lease_ms(lease), WANT_WINDOW_MS);
                    inner.run("try_acquire", &sql, true).await?
                }
            };
            let Some(row) = out.rows.first() else {
                return Ok((Attempt::Busy { retry_after: None }, None));
            };
            let ours = int(row, 0).unwrap_or(0) > 0;
            let fence = int(row, 1).unwrap_or(0);
            let remaining = int(row, 2);
            if !ours {
                return Ok((
                    Attempt::Busy {
                        retry_after: remaining.map(millis),
                    },
                    None,
                ));
            }
            let hold = Acquisition {
                inner: inner.clone(),
                undo: Some((name, token)),
            };
            let fence = fence_from(KIND, fence)?;
            Ok((Attempt::Acquired { fence }, Some(hold)))
        })
        .await?;
        if let Some(hold) = hold {
            hold.delivered();
        }
        Ok(attempt)
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let inner = self.inner.clone();
        let name = name.clone();
        spawn(async move { inner.release_token(&name, token).await }).await
    }

    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let inner = self.inner.clone();
        let name = name.clone();
        spawn(async move {
            let (a, b) = inner.ident(&name)?;
            let owner = inner.owner(token);
            let sql = inner.sql.extend(
                &MyLock {
                    region: &a,
                    key: &b,
                    token: &owner,
                },
                lease_ms(lease),
            );
            Ok(inner.run("extend", &sql, true).await?.affected > 0)
        })
        .await
    }

    /// Up to 2500 renewals per `UPDATE … JOIN (…)` statement, read back in the same round trip.
    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        if batch.is_empty() {
            return Vec::new();
        }
        let inner = self.inner.clone();
        let batch: Vec<Renewal> = batch.to_vec();
        let count = batch.len();
        let result = spawn(async move {
            let mut extended = vec![false; batch.len()];
            let idents: Vec<Option<(String, String, String, i64)>> = batch
                .iter()
                .map(|r| {
                    inner
                        .ident(&r.name)
                        .ok()
                        .map(|(a, b)| (a, b, inner.owner(r.token), lease_ms(r.lease)))
                })
                .collect();
            let valid: Vec<(usize, &(String, String, String, i64))> = idents
                .iter()
                .enumerate()
                .filter_map(|(i, e)| e.as_ref().map(|e| (i, e)))
                .collect();
            for chunk in valid.chunks(BATCH) {
                let locks: Vec<(MyLock<'_>, i64)> = chunk
                    .iter()
                    .map(|(_, (a, b, t, l))| {
                        (
                            MyLock {
                                region: a,
                                key: b,
                                token: t,
                            },
                            *l,
                        )
                    })
                    .collect();
                let sql = inner.sql.extend_many(&locks);
                let out = inner.run("extend_many", &sql, true).await?;
                for row in &out.rows {
                    if let Some(i) = int(row, 0).and_then(|i| usize::try_from(i).ok()) {
                        if let Some((original, _)) = chunk.get(i) {
                            extended[*original] = true;
                        }
                    }
                }
            }
            Ok(extended)
        })
        .await;
        match result {
            Ok(v) => v.into_iter().map(Ok).collect(),
            Err(e) => (0..count)
                .map(|_| {
                    Err(match &e {
                        Error::Unavailable { message, .. } => {
                            Error::unavailable(KIND, message.clone())
                        }
                        other => Error::backend(KIND, other.to_string()),
                    })
                })
                .collect(),
        }
    }

    /// Only releases made through this backend (or its clones) fire the subscription; other
    /// processes' releases are found by the registry's polling.
    async fn subscribe(&self, name: &LockName) -> Result<ReleaseSubscription> {
        let _ = self.inner.signals.take_idle(1024);
        Ok(self.inner.signals.subscribe(&channel(name)).0)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let inner = self.inner.clone();
        let name = name.clone();
        spawn(async move {
            let (a, b) = inner.ident(&name)?;
            let sql = inner.sql.inspect(&MyLock {
                region: &a,
                key: &b,
                token: "",
            });
            let out = inner.run("inspect", &sql, true).await?;
            out.rows
                .first()
                .map(|row| {
                    Ok(LockInfo {
                        fence: Some(fence_from(KIND, int(row, 0).unwrap_or(-1))?),
                        remaining: int(row, 1).map(millis),
                    })
                })
                .transpose()
        })
        .await
    }
}
