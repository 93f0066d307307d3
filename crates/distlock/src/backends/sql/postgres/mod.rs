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
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool::managed::QueueMode;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, Row};

use super::dialect::Pg;
use super::server::{self, capabilities, context, server_backend, LockTable, Server};
use super::{channel, fence_from, lease_ms, millis, parse_url, SqlOptions, WANT_WINDOW_MS};
use crate::backend::{
    detached, AcquireRequest, Attempt, Capabilities, LockInfo, LockName, ReleaseSignals,
    ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};

mod cycle;
mod listen;
mod pool;
mod state;
#[cfg(all(test, feature = "testkit"))]
mod tests;
mod tls;

#[doc(hidden)]
pub use self::cycle::LockCycle;
use self::pool::{Connector, Pool, Stmt};
use self::state::{Inner, KIND};
pub use self::tls::SslMode;
use self::tls::{TlsFiles, Transport};

/// The URL schemes of this backend.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// Locks in a PostgreSQL lease table; see the [module docs](self).
///
/// Cloning is cheap and shares the pool and the listening connection. `Debug` shows the
/// server, database, user and table, never the password.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

impl PostgresBackend {
    /// Connects with a URL: `postgres://[user[:password]@]host[:port][/database][?params]`
    /// (see the [module docs](super) for the parameters). One connection is opened and checked
    /// at once, so that a wrong address or password is reported here.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped midway, it leaves no connection open, only a lease table it may
    /// have created, which a later call would have created too.
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
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
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
        let connector = Connector {
            config,
            transport,
            connect_timeout: options.connect_timeout,
        };
        let pool = Pool::builder(connector)
            .max_size(options.pool_size)
            .queue_mode(QueueMode::Lifo)
            .build()
            .map_err(|e| Error::config(format!("postgres: the connection pool: {e}")))?;
        let backend = PostgresBackend {
            inner: Arc::new(Inner {
                target,
                user,
                password,
                pool,
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
            context(&backend.inner, "connect"),
            Some(limit),
            async move {
                let mut loan = inner.loan("connect").await?;
                loan.in_flight = true;
                if let Err(e) = inner.ensure_table(loan.client()).await {
                    return Err(inner.error("create table", &e));
                }
                loan.in_flight = false;
                Ok(())
            },
        )
        .await?;
        Ok(backend)
    }
}

impl Inner {
    /// The first two statement parameters for a lock: its row, LOCK_KEY first in Spring mode
    /// (the order of Spring's own statements).
    fn ident(&self, name: &LockName) -> Result<(String, String)> {
        let (region, key) = self.row_key(name)?;
        Ok(if self.options.spring {
            (key, region)
        } else {
            (region, key)
        })
    }

    fn payload(&self, name: &LockName) -> String {
        format!("{}:{}", self.origin, channel(name))
    }

    /// The acquisition statements: taking over the existing row first where the dialect has
    /// that statement (cheaper than an insert that conflicts), else the insert-or-take.
    async fn try_take(&self, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        if self.sql.acquire_existing.is_some() {
            let rows = self
                .query("try_acquire", Stmt::AcquireExisting, params, true)
                .await?;
            if !rows.is_empty() {
                return Ok(rows);
            }
        }
        self.query("try_acquire", Stmt::Acquire, params, true).await
    }
}

impl LockTable for Inner {
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

    async fn extend_token(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let (a, b) = self.ident(name)?;
        let owner = self.owner(token);
        let rows = self
            .query(
                "extend",
                Stmt::Extend,
                &[&a, &b, &owner, &lease_ms(lease)],
                true,
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn inspect_lock(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (a, b) = self.ident(name)?;
        let rows = self
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
    }

    async fn force_delete(&self, name: &LockName) -> Result<bool> {
        let (a, b) = self.ident(name)?;
        let payload = self.payload(name);
        let rows = self
            .query(
                "force_release",
                Stmt::ForceDelete,
                &[&a, &b, &self.listen_channel, &payload],
                true,
            )
            .await?;
        if !rows.is_empty() {
            self.signals.fire(&channel(name));
        }
        Ok(!rows.is_empty())
    }

    /// All renewals in one `UPDATE … FROM unnest(…)` statement.
    async fn extend_all(&self, batch: Vec<Renewal>) -> Result<Vec<bool>> {
        let mut a = Vec::with_capacity(batch.len());
        let mut b = Vec::with_capacity(batch.len());
        let mut owners = Vec::with_capacity(batch.len());
        let mut leases = Vec::with_capacity(batch.len());
        let mut entries = Vec::with_capacity(batch.len());
        for r in &batch {
            match self.ident(&r.name) {
                Ok((x, y)) => {
                    let owner = self.owner(r.token);
                    entries.push(Some((x.clone(), y.clone(), owner.clone())));
                    a.push(x);
                    b.push(y);
                    owners.push(owner);
                    leases.push(lease_ms(r.lease));
                }
                Err(_) => entries.push(None),
            }
        }
        let rows = self
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
    }
}

server_backend!(PostgresBackend);

impl PostgresBackend {
    fn caps(&self) -> Capabilities {
        capabilities(KIND, &self.inner.options)
    }

    /// PostgreSQL has no wait queue: both modes make the same attempt. It runs as its own
    /// task; an attempt whose caller went away gives the lock back once it committed.
    async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (token, lease) = (request.token, request.lease);
        server::acquire(&self.inner, request, move |inner, name| async move {
            let (a, b) = inner.ident(&name)?;
            let owner = inner.owner(token);
            let params: [&(dyn ToSql + Sync); 5] =
                [&a, &b, &owner, &lease_ms(lease), &WANT_WINDOW_MS];
            let rows = inner.try_take(&params).await?;
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
        })
        .await
    }

    /// Listens (once per backend, on a dedicated connection) to the table's channel; returns
    /// when the `LISTEN` is in force, so that no later release is missed. If the listening
    /// connection cannot be had within the connect timeout, the subscription still works from
    /// the moment it comes up (waiters poll meanwhile).
    async fn subscribe_waiter(&self, name: &LockName) -> Result<ReleaseSubscription> {
        // Forget the wake-up entries of keys nobody waits for any more (the channel is shared).
        let _ = self.inner.signals.take_idle(1024);
        let (sub, _) = self.inner.signals.subscribe(&channel(name));
        let mut up = self.inner.listener().up.clone();
        let timeout = self.inner.options.connect_timeout;
        let _ = tokio::time::timeout(timeout, up.wait_for(|g| *g > 0)).await;
        Ok(sub)
    }
}
