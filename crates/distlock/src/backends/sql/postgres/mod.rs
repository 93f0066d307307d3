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
use super::kinds::{disagreement, place, share_owner, HeldRow, Place, Share};
use super::lease_table::{capabilities, context, Common, Engine, LeaseTable, Take};
use super::shedlock::shown_owner;
use super::{channel, fence_from, lease_ms, millis, parse_url, SqlOptions, WANT_WINDOW_MS};
use crate::backend::{
    detached, Attempt, Capabilities, ListedLock, LockInfo, LockName, Owner, ReleaseSubscription,
    Released, Renewal, Token,
};
use crate::error::{Error, Result};

mod cycle;
mod listen;
mod places;
mod pool;
mod run;
mod state;
#[cfg(test)]
mod tests;
mod tls;
mod wait;
#[cfg(test)]
mod wait_tests;

#[doc(hidden)]
pub use self::cycle::LockCycle;
use self::places::Waits;
use self::pool::{Connector, Pool, Stmt};
pub use self::state::Postgres;
use self::state::KIND;
pub use self::tls::SslMode;
use self::tls::{TlsFiles, Transport};

/// The URL schemes of this backend.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// Locks in a PostgreSQL lease table; see the [module docs](self).
///
/// Cloning is cheap and shares the pool and the listening connection. `Debug` shows the
/// server, database, user and table, never the password.
pub type PostgresBackend = LeaseTable<Postgres>;

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
                         region, spring, layout, create_table, pool_size, connect_timeout, \
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
        let sql = if options.shedlock {
            Pg::shedlock(options.schema.as_deref(), &options.table)
        } else if options.spring {
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
        let origin = format!("{:016x}", rand::random::<u64>());
        let backend = PostgresBackend {
            inner: Arc::new(Postgres {
                common: Common::new(target, user, password, options),
                pool,
                sql,
                listener: OnceLock::new(),
                wake_channel: format!("{listen_channel}_{origin}"),
                listen_channel,
                origin,
                waits: Waits::default(),
                described: AtomicBool::new(true),
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

impl Postgres {
    /// The first two statement parameters for a lock: its row, LOCK_KEY first in Spring mode
    /// (the order of Spring's own statements).
    fn ident(&self, name: &LockName) -> Result<(String, String)> {
        let (region, key) = self.row_key(name)?;
        Ok(if !self.common.options.native() {
            (key, region)
        } else {
            (region, key)
        })
    }

    /// The release statement: the one that wakes the next waiter of the wait table, where
    /// there is one.
    fn release(&self) -> Stmt {
        if self.waits.ready.load(std::sync::atomic::Ordering::Acquire) {
            Stmt::ReleaseNext
        } else {
            Stmt::Release
        }
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

/// Reads the row of the inspect and list statements from column `at` on.
fn held_row(row: &Row, at: usize) -> HeldRow {
    HeldRow {
        token: row.get(at),
        fence: row.get(at + 1),
        remaining_ms: row.get(at + 2),
        shares: row.get(at + 3),
        permits: row.get(at + 4),
        share_remaining_ms: row.get(at + 5),
        writers: row.get(at + 6),
        share_owners: row.get::<_, Option<String>>(at + 7).map(String::into_bytes),
        owner: row.get::<_, Option<String>>(at + 8).map(String::into_bytes),
    }
}

impl Postgres {
    /// What a Spring- or ShedLock-layout row says of its holder from column `at` on: Spring:
    /// distlock's description, else the `CLIENT_ID` (a Spring client's hold); ShedLock: the
    /// description part of distlock's `locked_by`, else all of it (ShedLock's host name).
    fn foreign_owner(&self, row: &Row, at: usize) -> String {
        let described: Option<String> = row.get(at);
        let client: Option<String> = row.get(at + 1);
        if self.common.options.shedlock {
            return shown_owner(client.unwrap_or_default().as_bytes());
        }
        Owner::shown(described.or(client).unwrap_or_default().as_bytes())
    }
}

impl Postgres {
    /// Records the name of `name`'s row (Spring mode, once per key and backend) so that
    /// `list` can show the key; `false` when there is nothing to record or it failed (it is
    /// tried again next time).
    async fn record_name(&self, name: &LockName, a: &str, b: &str) -> bool {
        if self.sql.name_key.is_none() || !self.common.name_unrecorded(a, b) {
            return false;
        }
        let key = name.key();
        match self
            .query("record key name", Stmt::NameKey, &[&a, &b, &key], true)
            .await
        {
            Ok(_) => {
                self.common.name_recorded(a, b);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "the key's name was not recorded; list shows its LOCK_KEY");
                false
            }
        }
    }

    /// A read hold or a permit: one statement, or where that finds the key's row changing (or
    /// missing), the transaction after the row lock (see `PgKinds`). A reader first tries the
    /// key's row alone (`PgKinds::acquire_lone`).
    async fn take_shared(&self, take: Take<'_>, share: Share) -> Result<Attempt> {
        let (name, token) = (take.name, take.token);
        let (a, b) = self.ident(name)?;
        let (owner, lease) = (share_owner(name, token), lease_ms(take.lease));
        if share.is_read() {
            let rows = self
                .query(
                    "try_acquire",
                    Stmt::AcquireLone,
                    &[&a, &b, &owner, &lease, &take.described],
                    true,
                )
                .await?;
            if let Some(row) = rows.first() {
                return Ok(Attempt::Acquired {
                    fence: fence_from(KIND, row.get(0))?,
                });
            }
        }
        let params: [&(dyn ToSql + Sync); 9] = [
            &a,
            &b,
            &owner,
            &lease,
            &WANT_WINDOW_MS,
            &share.code,
            &share.permits,
            &share.mark,
            &take.described,
        ];
        let mut rows = self
            .query("try_acquire", Stmt::AcquireShareNow, &params, true)
            .await?;
        if !rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
            rows = self
                .query_locked("try_acquire", &[&a, &b], Stmt::AcquireShare, &params, true)
                .await?;
        }
        let row = match rows.first() {
            Some(row) if row.get::<_, bool>(0) => row,
            _ => return Err(Error::backend(KIND, "the acquisition found no row to take")),
        };
        let (ok, fence, other, remaining): (bool, i64, Option<i64>, i64) =
            (row.get(1), row.get(2), row.get(3), row.get(4));
        if ok {
            return Ok(Attempt::Acquired {
                fence: fence_from(KIND, fence)?,
            });
        }
        match other {
            Some(theirs) if !share.is_read() => Err(disagreement(name, theirs)),
            _ => Ok(Attempt::Busy {
                retry_after: Some(millis(remaining)),
                ahead: None,
            }),
        }
    }

    /// After an exclusive attempt of a waiter: one that found readers in takes (or renews)
    /// its place; one that acquired gives its place back.
    async fn writer_place(&self, a: &str, b: &str, token: Token, acquired: bool) {
        let waiter = token.to_string();
        if acquired {
            if self.common.writers.take(token) {
                let _ = self
                    .query("try_acquire", Stmt::Unplace, &[&a, &b, &waiter], true)
                    .await;
            }
            return;
        }
        match self
            .query("try_acquire", Stmt::WriterPlace, &[&a, &b, &waiter], true)
            .await
        {
            Ok(rows) if !rows.is_empty() => self.common.writers.taken(token),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "the waiting writer's place was not taken"),
        }
    }
}

impl Engine for Postgres {
    const KIND: &'static str = KIND;
    const NAME: &'static str = "PostgresBackend";

    fn capabilities(&self) -> Capabilities {
        capabilities(KIND, &self.common.options).owners(true)
    }

    fn common(&self) -> &Common {
        &self.common
    }

    async fn take_share(&self, take: Take<'_>, share: Share) -> Result<Attempt> {
        self.take_shared(take, share).await
    }

    /// PostgreSQL has no wait queue: both modes make the same attempt.
    async fn take_row(&self, take: Take<'_>) -> Result<Attempt> {
        let (name, token) = (take.name, take.token);
        let (a, b) = self.ident(name)?;
        let owner = self.owner(name, token);
        if let Some(busy) = self.peek(&a, &b, &owner).await {
            self.after_attempt(name, token, false).await;
            return Ok(busy);
        }
        let lease = lease_ms(take.lease);
        let params: [&(dyn ToSql + Sync); 6] =
            [&a, &b, &owner, &lease, &WANT_WINDOW_MS, &take.described];
        let (rows, _) = tokio::join!(self.try_take(&params), self.record_name(name, &a, &b));
        let row = rows?.into_iter().next();
        if take.queued && self.common.options.native() {
            // A waiting writer keeps new readers out (see `PgKinds::writer_place`).
            let (ours, readers) = row.as_ref().map_or((false, false), |r| {
                (r.get::<_, bool>(0), r.get::<_, bool>(3))
            });
            if ours && self.common.writers.has(token) {
                self.writer_place(&a, &b, token, true).await;
            } else if !ours && readers {
                self.writer_place(&a, &b, token, false).await;
            }
        }
        let ours = row.as_ref().is_some_and(|r| r.get::<_, bool>(0));
        self.after_attempt(name, token, ours).await;
        let Some(row) = row else {
            return Ok(Attempt::BUSY);
        };
        let (fence, remaining): (i64, i64) = (row.get(1), row.get(2));
        if !ours {
            return Ok(Attempt::Busy {
                retry_after: Some(millis(remaining)),
                ahead: None,
            });
        }
        Ok(Attempt::Acquired {
            fence: fence_from(KIND, fence)?,
        })
    }

    /// Listens (once per backend, on a dedicated connection) to the table's channel; returns
    /// when the `LISTEN` is in force, so that no later release is missed. If the listening
    /// connection cannot be had within the connect timeout, the subscription still works from
    /// the moment it comes up (waiters poll meanwhile).
    ///
    /// A waiter for a mutex or a write lock also takes a place in the wait table, and the
    /// subscription returned wakes it when a release takes that place out (see `wait.rs`).
    async fn listen(
        self: &Arc<Self>,
        name: &LockName,
        waiter: Token,
    ) -> Result<Option<ReleaseSubscription>> {
        let mut up = self.listener().up.clone();
        let timeout = self.common.options.connect_timeout;
        let _ = tokio::time::timeout(timeout, up.wait_for(|g| *g > 0)).await;
        Ok(self.wait_in_line(name, waiter).await)
    }

    async fn leave_place(&self, name: &LockName, token: Token) -> Result<()> {
        if !self.common.writers.take(token) {
            return Ok(());
        }
        let (a, b) = self.ident(name)?;
        let (waiter, payload) = (token.to_string(), self.payload(name));
        let rows = self
            .query(
                "leave_queue",
                Stmt::Leave,
                &[&a, &b, &waiter, &self.listen_channel, &payload],
                true,
            )
            .await?;
        if !rows.is_empty() {
            self.common.signals.fire(&channel(name));
        }
        Ok(())
    }

    async fn held_keys(&self, region: String) -> Result<Vec<ListedLock>> {
        let rows = self.query("list", Stmt::List, &[&region], true).await?;
        let mut listed = Vec::with_capacity(rows.len());
        for row in &rows {
            if !self.common.options.native() {
                let key: Option<String> = row.get(0);
                let key = key.unwrap_or_else(|| row.get(1));
                listed.push(ListedLock {
                    key,
                    info: LockInfo::new(
                        Some(fence_from(KIND, row.get(2))?),
                        Some(millis(row.get(3))),
                    )
                    .with_kind(crate::backend::LockKind::Mutex)
                    .with_holders(1)
                    .with_owners([self.foreign_owner(row, 4)]),
                });
            } else if let Some(info) = held_row(row, 1).info(KIND)? {
                listed.push(ListedLock {
                    key: row.get(0),
                    info,
                });
            }
        }
        Ok(listed)
    }

    async fn release_token(&self, name: &LockName, token: Token) -> Result<Released> {
        let (a, b) = self.ident(name)?;
        let payload = self.payload(name);
        if let Place::Shared(share) = place(name) {
            self.check_kind(name)?;
            let owner = share_owner(name, token);
            let params: [&(dyn ToSql + Sync); 5] = [&a, &b, &owner, &self.listen_channel, &payload];
            if share.is_read() {
                // A lone reader's release is the mutex's; a reader that was joined is in the
                // holds table.
                let rows = self
                    .query("release", self.release(), &params, false)
                    .await?;
                if let Some(row) = rows.first() {
                    return Ok(Released {
                        was_held: true,
                        contended: row.get(0),
                    });
                }
            }
            // Unsettled (the row changing, or missing), it changed nothing: again after the
            // row lock.
            let mut rows = self
                .query("release", Stmt::ReleaseShareNow, &params, false)
                .await?;
            if !rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
                rows = self
                    .query_locked("release", &[&a, &b], Stmt::ReleaseShare, &params, false)
                    .await?;
            }
            let (was_held, contended) = rows
                .first()
                .map_or((false, false), |r| (r.get(1), r.get(2)));
            return Ok(Released {
                was_held,
                contended,
            });
        }
        let owner = self.owner(name, token);
        let rows = self
            .query(
                "release",
                self.release(),
                &[&a, &b, &owner, &self.listen_channel, &payload],
                false,
            )
            .await?;
        Ok(rows.first().map_or_else(Released::default, |row| Released {
            was_held: true,
            contended: row.get(0),
        }))
    }

    async fn extend_token(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let (a, b) = self.ident(name)?;
        let lease = lease_ms(lease);
        let (stmt, owner) = match place(name) {
            Place::Row => (Stmt::Extend, self.owner(name, token)),
            Place::Shared(share) => {
                self.check_kind(name)?;
                let owner = share_owner(name, token);
                if share.is_read() {
                    // A lone reader's renewal is the mutex's.
                    let rows = self
                        .query("extend", Stmt::Extend, &[&a, &b, &owner, &lease], true)
                        .await?;
                    if !rows.is_empty() {
                        return Ok(true);
                    }
                }
                (Stmt::ExtendShare, owner)
            }
        };
        let rows = self
            .query("extend", stmt, &[&a, &b, &owner, &lease], true)
            .await?;
        Ok(!rows.is_empty())
    }

    async fn inspect_lock(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (a, b) = self.ident(name)?;
        let rows = self
            .query("inspect", Stmt::Inspect, &[&a, &b], true)
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        if !self.common.options.native() {
            return Ok(Some(
                LockInfo::new(
                    Some(fence_from(KIND, row.get(0))?),
                    Some(millis(row.get(1))),
                )
                .with_kind(crate::backend::LockKind::Mutex)
                .with_holders(1)
                .with_owners([self.foreign_owner(row, 2)]),
            ));
        }
        held_row(row, 0).info(KIND)
    }

    async fn force_delete(&self, name: &LockName) -> Result<bool> {
        let (a, b) = self.ident(name)?;
        let payload = self.payload(name);
        if self.common.options.native() {
            let rows = self
                .query_locked(
                    "force_release",
                    &[&a, &b],
                    Stmt::ForceShares,
                    &[&a, &b, &self.listen_channel, &payload],
                    true,
                )
                .await?;
            self.common.signals.fire(&channel(name));
            return Ok(rows.first().is_some_and(|r| r.get(0)));
        }
        let rows = self
            .query(
                "force_release",
                Stmt::ForceDelete,
                &[&a, &b, &self.listen_channel, &payload],
                true,
            )
            .await?;
        if !rows.is_empty() {
            self.common.signals.fire(&channel(name));
        }
        Ok(!rows.is_empty())
    }

    /// All exclusive renewals in one `UPDATE … FROM unnest(…)` statement; shared ones (a few:
    /// the readers of a registry share one hold) one statement each, at once.
    async fn extend_all(&self, batch: Vec<Renewal>) -> Result<Vec<bool>> {
        let (shared, batch): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .enumerate()
            .partition(|(_, r)| matches!(place(&r.name), Place::Shared(_)));
        let mut out = vec![false; shared.len() + batch.len()];
        let renewed = futures_util::future::join_all(
            shared
                .iter()
                .map(|(_, r)| self.extend_token(&r.name, r.token, r.lease)),
        )
        .await;
        for ((i, _), r) in shared.iter().zip(renewed) {
            out[*i] = r?;
        }
        if batch.is_empty() {
            return Ok(out);
        }
        let (at, batch): (Vec<usize>, Vec<Renewal>) = batch.into_iter().unzip();
        for (i, r) in at.into_iter().zip(self.extend_rows(batch).await?) {
            out[i] = r;
        }
        Ok(out)
    }
}

impl Postgres {
    /// Renewals of exclusive holds in one `UPDATE … FROM unnest(…)` statement.
    async fn extend_rows(&self, batch: Vec<Renewal>) -> Result<Vec<bool>> {
        let mut a = Vec::with_capacity(batch.len());
        let mut b = Vec::with_capacity(batch.len());
        let mut owners = Vec::with_capacity(batch.len());
        let mut leases = Vec::with_capacity(batch.len());
        let mut entries = Vec::with_capacity(batch.len());
        for r in &batch {
            match self.ident(&r.name) {
                Ok((x, y)) => {
                    let owner = self.owner(&r.name, r.token);
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
