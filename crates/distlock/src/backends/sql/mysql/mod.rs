//! MySQL / MariaDB backend: the lease table of the [`sql`](super) module over `mysql_async`.
//! MySQL has no `NOTIFY`: waiters are woken through a `GET_LOCK` "doorbell" per lock that the
//! holder's backend keeps on its statement connection (see the `doorbell` module), and
//! poll as a fallback (the registry does that, jittered, backing off); releases made through
//! this backend wake waiters of the same process at once.
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
//! Every statement runs in autocommit mode on one of the backend's `pool_size` sessions
//! (default one), connections it opens on first use and keeps (see `session`); with the
//! waiters' one listener, a backend uses two connections to the server by default, whatever
//! the number of keys it holds or waits for. The common acquisition and the release are one `UPDATE` each, whose outcome comes back
//! in the OK packet (matched rows and a `LAST_INSERT_ID(expr)` value), without a result set.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::{OptsBuilder, SslOpts};

use super::dialect::{My, MyLock, MyOutcome, MyShareOutcome};
use super::doorbell::{doorbell_name, Doorbells, HEAD_GRACE_MS, LISTEN_WAIT_S};
use super::kinds::{disagreement, place, share_owner, HeldRow, Place, Share, WriterPlaces};
use super::server::{self, capabilities, context, server_backend, LockTable, Server};
use super::{channel, fence_from, lease_ms, millis, parse_url, scrub, SqlOptions, WANT_WINDOW_MS};
use crate::backend::{
    detached, AcquireRequest, Attempt, Capabilities, ListedLock, LockInfo, LockKind, LockName,
    ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};

mod conn;
pub(in crate::backends::sql) mod session;
mod state;
#[cfg(all(test, feature = "testkit"))]
mod tests;

pub(super) use self::conn::discard;
use self::conn::{classify, int, Class, SslMode};
use self::session::{Failed, Ring};
use self::state::{Inner, KIND};

/// The URL schemes of this backend.
pub const SCHEMES: &[&str] = &["mysql", "mariadb"];
/// One entry of a batch renewal: region, key, owner and lease in milliseconds.
type Renewed = (String, String, String, i64);

/// Renewals per `UPDATE` statement in [`Backend::extend_many`](crate::Backend::extend_many)
/// (one commit each).
const BATCH: usize = 2500;

/// Locks in a MySQL or MariaDB lease table; see the [module docs](self).
///
/// Cloning is cheap and shares the connections. `Debug` never shows the password.
#[derive(Clone)]
pub struct MySqlBackend {
    inner: Arc<Inner>,
}

impl MySqlBackend {
    /// Connects with a URL: `mysql://[user[:password]@]host[:port][/database][?params]`
    /// (`mariadb://` too; see the [module docs](super) for the parameters). One connection is
    /// opened and checked at once, so that a wrong address or password is reported here.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, it closes the connections it opened; a lease table it already
    /// created stays (the next call would create it anyway).
    pub async fn connect(url: &str) -> Result<Self> {
        let parsed = parse_url(KIND, SCHEMES, url)?;
        let mut mode = None;
        let (mut ca, mut cert, mut key) = (None, None, None);
        for (name, value) in &parsed.rest {
            match name.as_str() {
                "ssl-mode" | "ssl_mode" | "sslmode" => mode = Some(value.to_ascii_lowercase()),
                "ssl-ca" | "ssl_ca" => ca = Some(value.clone()),
                "ssl-cert" | "ssl_cert" => cert = Some(value.clone()),
                "ssl-key" | "ssl_key" => key = Some(value.clone()),
                other => {
                    return Err(Error::config(format!(
                        "mysql URL: unknown query parameter {other:?} (known: table, schema, \
                         region, spring, create_table, pool_size, connect_timeout, \
                         request_timeout, allow_insecure_auth, ssl-mode, ssl-ca, ssl-cert, \
                         ssl-key)"
                    )))
                }
            }
        }
        let secret = parsed.password.as_deref().is_some_and(|p| !p.is_empty());
        let mode = match &mode {
            Some(m) => SslMode::parse(m)?,
            // No password, nothing secret to protect: plain TCP, as MySQL's clients did before
            // 5.7 (an explicit `preferred` uses TLS when the server offers it).
            None if !secret => SslMode::Disabled,
            None => SslMode::Preferred,
        };
        let identity = match (cert, key) {
            (None, None) => None,
            (Some(c), Some(k)) => Some(mysql_async::ClientIdentity::new(
                std::path::PathBuf::from(c).into(),
                std::path::PathBuf::from(k).into(),
            )),
            _ => {
                return Err(Error::config(
                    "mysql URL: ssl-cert and ssl-key go together (the client certificate and \
                     its key)",
                ))
            }
        };
        let tls = |verify: bool, check_name: bool| {
            let mut s = SslOpts::default().with_client_identity(identity.clone());
            if !verify {
                s = s.with_danger_accept_invalid_certs(true);
            }
            if !verify || !check_name {
                s = s.with_danger_skip_domain_validation(true);
            }
            match &ca {
                Some(path) => s
                    .with_root_certs(vec![std::path::PathBuf::from(path).into()])
                    .with_disable_built_in_roots(true),
                None => s,
            }
        };
        // A password goes only to a verified server unless the URL says otherwise (see the
        // module docs): the server picks the authentication method, and some reveal the
        // password (`mysql_clear_password`; `caching_sha2_password`'s full authentication,
        // which sends it in clear over TLS, or encrypted with a key fetched from the server).
        let insecure_ok = !secret || parsed.options.allow_insecure_auth;
        let refuse = |why: &str| {
            Error::config(format!(
                "mysql URL: refusing to send the password to a server that is not verified: \
                 {why}. Use ssl-mode=verify_identity or verify_ca (with ssl-ca=<CA file> for a \
                 private CA), or add allow_insecure_auth=true to send it anyway"
            ))
        };
        let (ssl, verified) = match mode {
            SslMode::Disabled if !insecure_ok => return Err(refuse("ssl-mode=disabled")),
            SslMode::Required if !insecure_ok => {
                return Err(refuse(
                    "ssl-mode=required encrypts but does not check the certificate",
                ))
            }
            SslMode::Disabled => (None, false),
            SslMode::Required => (Some(tls(false, false)), false),
            SslMode::VerifyCa => (Some(tls(true, false)), true),
            SslMode::VerifyIdentity => (Some(tls(true, true)), true),
            // TLS when the server offers it: verified when a password is at stake.
            SslMode::Preferred => (Some(tls(!insecure_ok, true)), !insecure_ok),
        };
        let user = parsed.user.clone().unwrap_or_else(|| "root".to_owned());
        let port = parsed.port.unwrap_or(3306);
        let target = format!(
            "{}:{port}/{}",
            parsed.host,
            parsed.database.as_deref().unwrap_or("")
        );
        let mut builder = OptsBuilder::default()
            .ip_or_hostname(parsed.host.clone())
            .tcp_port(port)
            .user(Some(user.clone()))
            .pass(parsed.password.clone())
            .db_name(parsed.database.clone())
            .prefer_socket(false)
            .enable_cleartext_plugin(verified || parsed.options.allow_insecure_auth)
            .ssl_opts(ssl);
        if mode == SslMode::Preferred {
            // Does the server offer TLS? Asking costs one connection; without TLS the driver
            // stops before it sends anything of the password.
            let probe = mysql_async::Conn::new(mysql_async::Opts::from(builder.clone()));
            match tokio::time::timeout(parsed.options.connect_timeout, probe).await {
                Ok(Ok(conn)) => discard(conn),
                Ok(Err(mysql_async::Error::Driver(
                    mysql_async::DriverError::NoClientSslFlagFromServer,
                ))) => {
                    if !insecure_ok {
                        return Err(Error::backend(
                            KIND,
                            scrub(
                                format!(
                                    "connect to {target}: refusing to send the password of \
                                     user {user:?}: the server offers no TLS (ssl-mode=\
                                     preferred). Enable TLS on the server, or add \
                                     allow_insecure_auth=true to the URL to send it anyway"
                                ),
                                parsed.password.as_deref(),
                            ),
                        ));
                    }
                    builder = builder.ssl_opts(None);
                }
                // Other failures are reported by the first connection below.
                _ => {}
            }
        }
        Self::connect_with(builder, user, parsed.password, target, parsed.options).await
    }

    /// Connects with `mysql_async` options and explicit [`SqlOptions`]; the number of
    /// connections comes from `options`, and found-rows counting is set.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
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
        // With `zookeeper-tls` rustls has two providers, and `mysql_async` builds its TLS
        // configuration with the process default.
        #[cfg(feature = "zookeeper-tls")]
        crate::tls::ensure_default_provider();
        options.validate(KIND)?;
        let builder = builder
            .client_found_rows(true)
            .tcp_nodelay(true)
            .prefer_socket(false);
        let opts = mysql_async::Opts::from(builder.clone());
        let database = options
            .schema
            .clone()
            .or_else(|| opts.db_name().map(str::to_owned))
            .unwrap_or_default();
        let qualified_table = format!("{database}.{}", options.table);
        // The prepared statements are those of the native layout (Spring's are sent as text).
        let native = My::new(options.schema.as_deref(), &options.table, false);
        let backend = MySqlBackend {
            inner: Arc::new(Inner {
                qualified_table,
                // The statement connections (sessions), which also hold the doorbells.
                doorbells: Doorbells::new(
                    opts,
                    options.pool_size,
                    options.connect_timeout,
                    options.request_timeout,
                ),
                target,
                user,
                password,
                sql: My::new(options.schema.as_deref(), &options.table, options.spring),
                acquire_prepared: native.acquire_existing_prepared(None),
                acquire_deferring: native.acquire_existing_prepared(Some(HEAD_GRACE_MS)),
                release_prepared: native.release_prepared(),
                acquire_lone: native.acquire_lone_prepared(),
                options,
                ready: tokio::sync::Mutex::new(false),
                ready_fast: AtomicBool::new(false),
                signals: Arc::default(),
                side_table: AtomicBool::new(false),
                writers: WriterPlaces::default(),
                named: Default::default(),
            }),
        };
        // Check one connection now (a wrong host or password is reported here) and create the
        // table unless it exists, so that the first lock operation does not pay for the DDL.
        let inner = backend.inner.clone();
        let limit = inner.options.connect_timeout + inner.options.request_timeout;
        detached(
            KIND,
            context(&backend.inner, "connect"),
            Some(limit),
            async move {
                match inner.ensure_table().await {
                    Ok(()) => Ok(()),
                    Err(Failed { error, sent: false }) => Err(inner.error("connect", &error)),
                    Err(Failed { error, .. }) => Err(inner.error("create table", &error)),
                }
            },
        )
        .await?;
        Ok(backend)
    }
}

impl Inner {
    /// The `GET_LOCK` name that rings when the lock of [`row_key`](Server::row_key) `(a, b)` is
    /// released.
    fn doorbell(&self, a: &str, b: &str) -> String {
        doorbell_name(&self.qualified_table, a, b)
    }
}

/// Reads a row of the inspect and list statements (native layout) from column `at` on.
fn held_row(row: &mysql_async::Row, at: usize) -> HeldRow {
    let token = row
        .get_opt::<Option<String>, usize>(at)
        .and_then(|v| v.ok())
        .flatten()
        .unwrap_or_default();
    HeldRow {
        token,
        fence: int(row, at + 1).unwrap_or(-1),
        remaining_ms: int(row, at + 2).unwrap_or(0),
        shares: int(row, at + 3).unwrap_or(0),
        permits: int(row, at + 4),
        share_remaining_ms: int(row, at + 5),
        writers: int(row, at + 6).unwrap_or(0),
    }
}

/// The matched rows and `LAST_INSERT_ID` of statement `i` of a packet.
fn statement(out: &session::Outcome, i: usize) -> (u64, Option<u64>) {
    out.statements.get(i).copied().unwrap_or((0, None))
}

/// A column of bytes (a key) as text.
fn text(row: &mysql_async::Row, i: usize) -> Option<String> {
    row.get_opt::<Option<Vec<u8>>, usize>(i)
        .and_then(|v| v.ok())
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}

/// Most key names a Spring-mode backend remembers having recorded.
const MAX_NAMED: usize = 100_000;

impl Inner {
    /// The statement that records the key name of `name`'s row `(a, b)` (Spring mode, once
    /// per key and backend) so that `list` can show the key, if it is still to be recorded.
    fn name_to_record(&self, name: &LockName, a: &str, b: &str) -> Option<String> {
        let fresh = self.options.spring
            && self.side_table.load(std::sync::atomic::Ordering::Acquire)
            && !self
                .named
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&(a.to_owned(), b.to_owned()));
        fresh.then(|| {
            self.sql.name_key(
                &MyLock {
                    region: a,
                    key: b,
                    token: "",
                },
                name.key(),
            )
        })
    }

    fn recorded_name(&self, a: &str, b: &str) {
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        if named.len() >= MAX_NAMED {
            named.clear();
        }
        named.insert((a.to_owned(), b.to_owned()));
    }

    /// A read hold or a permit: one transaction in one round trip (see `My::acquire_share`).
    /// A reader first tries the key's row alone (`My::acquire_lone_prepared`).
    async fn take_share(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
        share: Share,
    ) -> Result<Attempt> {
        let (a, b) = self.row_key(name)?;
        let owner = share_owner(name, token);
        let lock = MyLock {
            region: &a,
            key: &b,
            token: &owner,
        };
        let (lease, want) = (lease_ms(lease), WANT_WINDOW_MS);
        let unreported =
            || Error::backend(KIND, "the server did not report the acquisition's outcome");
        let mut outcome = None;
        if share.is_read() {
            let out = self
                .run_prepared("try_acquire", &self.acquire_lone, &lock, lease, true)
                .await?;
            if out.affected > 0 {
                let fence = out.last_insert_id.and_then(|f| i64::try_from(f).ok());
                outcome = Some(MyShareOutcome::Acquired {
                    fence: fence.ok_or_else(unreported)?,
                });
            }
        }
        let outcome = match outcome {
            Some(o) => o,
            None => {
                let sql = self.sql.acquire_share(&lock, share, lease, want);
                let out = self.run_transaction("try_acquire", &sql, true).await?;
                match statement(&out, My::share_outcome_at(share)) {
                    (0, _) => {
                        // The key's first use: the transaction that creates its row.
                        let sql = self.sql.acquire_share_first(&lock, share, lease, want);
                        let out = self.run_transaction("try_acquire", &sql, true).await?;
                        let Some(row) = out.rows.first() else {
                            return Err(Error::backend(
                                KIND,
                                "the acquisition returned no outcome",
                            ));
                        };
                        match (int(row, 0), int(row, 1)) {
                            (Some(fence), _) => MyShareOutcome::Acquired { fence },
                            (None, Some(permits)) => MyShareOutcome::Disagree { permits },
                            _ => MyShareOutcome::Busy {
                                remaining_ms: int(row, 2).unwrap_or(0),
                            },
                        }
                    }
                    (_, v) => v.and_then(MyShareOutcome::decode).ok_or_else(unreported)?,
                }
            }
        };
        match outcome {
            MyShareOutcome::Acquired { fence } => {
                // The process holds the lock: its doorbell listener lets the next process watch.
                self.doorbells.acquired(&self.doorbell(&a, &b));
                Ok(Attempt::Acquired {
                    fence: fence_from(KIND, fence)?,
                })
            }
            MyShareOutcome::Disagree { permits } if !share.is_read() => {
                Err(disagreement(name, permits))
            }
            MyShareOutcome::Disagree { .. } => Ok(Attempt::Busy { retry_after: None }),
            MyShareOutcome::Busy { remaining_ms } => Ok(Attempt::Busy {
                retry_after: Some(millis(remaining_ms)),
            }),
        }
    }

    /// After an exclusive attempt: a waiting writer that found readers in takes (or renews)
    /// its place; one that acquired gives its place back.
    async fn writer_place(&self, lock: &MyLock<'_>, token: Token, acquired: bool) {
        let waiter = token.to_string();
        let lock = MyLock {
            token: &waiter,
            ..lock.clone()
        };
        if acquired {
            if self.writers.take(token) {
                let _ = self.run("leave_queue", &self.sql.leave(&lock), true).await;
            }
            return;
        }
        match self
            .run("try_acquire", &self.sql.writer_place(&lock), true)
            .await
        {
            Ok(out) if out.affected > 0 => self.writers.taken(token),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "the waiting writer's place was not taken"),
        }
    }
}

impl LockTable for Inner {
    fn places(&self) -> &WriterPlaces {
        &self.writers
    }

    async fn leave_place(&self, name: &LockName, token: Token) -> Result<()> {
        if !self.writers.take(token) {
            return Ok(());
        }
        let (a, b) = self.row_key(name)?;
        let waiter = token.to_string();
        let sql = self.sql.leave(&MyLock {
            region: &a,
            key: &b,
            token: &waiter,
        });
        // Readers kept out may come in: those of this process are woken here, the others'
        // doorbell listeners see the row free of a waiting writer.
        self.run("leave_queue", &sql, true).await?;
        self.signals.fire(&channel(name));
        Ok(())
    }

    async fn held_keys(&self, region: String) -> Result<Vec<ListedLock>> {
        let out = self.run("list", &self.sql.list(&region), true).await?;
        let mut listed = Vec::with_capacity(out.rows.len());
        for row in &out.rows {
            if self.options.spring {
                let Some(key) = text(row, 0).or_else(|| text(row, 1)) else {
                    continue;
                };
                listed.push(ListedLock {
                    key,
                    info: LockInfo::new(
                        Some(fence_from(KIND, int(row, 2).unwrap_or(-1))?),
                        int(row, 3).map(millis),
                    )
                    .with_kind(LockKind::Mutex)
                    .with_holders(1),
                });
            } else if let (Some(key), Some(info)) = (text(row, 0), held_row(row, 1).info(KIND)?) {
                listed.push(ListedLock { key, info });
            }
        }
        Ok(listed)
    }

    async fn release_token(&self, name: &LockName, token: Token) -> Result<Released> {
        let (a, b) = self.row_key(name)?;
        if let Place::Shared(share) = place(name) {
            self.check_kind(name)?;
            let owner = share_owner(name, token);
            let lock = MyLock {
                region: &a,
                key: &b,
                token: &owner,
            };
            if share.is_read() {
                // A lone reader's release is the mutex's; a reader that was joined is in the
                // holds table.
                let out = self
                    .run_prepared("release", &self.release_prepared, &lock, 0, false)
                    .await?;
                if out.affected > 0 {
                    self.signals.fire(&channel(name));
                    return Ok(Released {
                        was_held: true,
                        contended: out.last_insert_id == Some(2),
                    });
                }
            }
            let sql = self.sql.release_share(&lock);
            let out = self.run_transaction("release", &sql, false).await?;
            let (matched, code) = statement(&out, 1);
            let code = code.unwrap_or(0);
            let (released, contended) = (matched > 0, code & 2 == 2);
            if released {
                self.signals.fire(&channel(name));
            }
            return Ok(Released {
                was_held: released,
                contended,
            });
        }
        let owner = self.owner(name, token);
        let lock = MyLock {
            region: &a,
            key: &b,
            token: &owner,
        };
        let doorbell = self.doorbell(&a, &b);
        let out = if self.doorbells.is_armed(&doorbell) {
            // Release and ring in one round trip, on the connection that holds the doorbell.
            let sql = self.sql.release(&lock);
            match self.doorbells.exec(&doorbell, sql, Ring::Disarm).await {
                Ok(out) => out,
                // Nothing was sent (no connection): the release's own retries, without the
                // doorbell, which no connection holds any more.
                Err(Failed { sent: false, .. }) => self.release_plain(&lock).await?,
                Err(Failed { error, .. }) => return Err(self.error("release", &error)),
            }
        } else {
            self.release_plain(&lock).await?
        };
        let (was_held, contended) = if self.options.spring {
            let row = out.rows.first();
            let held = row.and_then(|r| int(r, 0)).unwrap_or(0) > 0;
            (held, row.and_then(|r| int(r, 1)).unwrap_or(0) > 0)
        } else {
            (out.affected > 0, out.last_insert_id == Some(2))
        };
        if !was_held {
            return Ok(Released::default());
        }
        self.signals.fire(&channel(name));
        Ok(Released {
            was_held,
            contended,
        })
    }

    async fn extend_token(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let (a, b) = self.row_key(name)?;
        if let Place::Shared(share) = place(name) {
            self.check_kind(name)?;
            let owner = share_owner(name, token);
            let lock = MyLock {
                region: &a,
                key: &b,
                token: &owner,
            };
            // A lone reader's renewal is the mutex's.
            if share.is_read()
                && self
                    .run("extend", &self.sql.extend(&lock, lease_ms(lease)), true)
                    .await?
                    .affected
                    > 0
            {
                return Ok(true);
            }
            let sql = self.sql.extend_share(&lock, lease_ms(lease));
            let out = self.run_transaction("extend", &sql, true).await?;
            return Ok(statement(&out, 2).0 > 0);
        }
        let owner = self.owner(name, token);
        let sql = self.sql.extend(
            &MyLock {
                region: &a,
                key: &b,
                token: &owner,
            },
            lease_ms(lease),
        );
        Ok(self.run("extend", &sql, true).await?.affected > 0)
    }

    async fn inspect_lock(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (a, b) = self.row_key(name)?;
        let sql = self.sql.inspect(&MyLock {
            region: &a,
            key: &b,
            token: "",
        });
        let out = self.run("inspect", &sql, true).await?;
        let Some(row) = out.rows.first() else {
            return Ok(None);
        };
        if self.options.spring {
            return Ok(Some(
                LockInfo::new(
                    Some(fence_from(KIND, int(row, 0).unwrap_or(-1))?),
                    int(row, 1).map(millis),
                )
                .with_kind(LockKind::Mutex)
                .with_holders(1),
            ));
        }
        held_row(row, 0).info(KIND)
    }

    async fn force_delete(&self, name: &LockName) -> Result<bool> {
        let (a, b) = self.row_key(name)?;
        let sql = self.sql.force_delete(&MyLock {
            region: &a,
            key: &b,
            token: "",
        });
        let existed = if self.options.spring {
            self.run("force_release", &sql, true).await?.affected > 0
        } else {
            let out = self.run_transaction("force_release", &sql, true).await?;
            out.rows.first().and_then(|r| int(r, 0)).unwrap_or(0) > 0
        };
        self.signals.fire(&channel(name));
        Ok(existed)
    }

    /// Up to 2500 exclusive renewals per `UPDATE … JOIN (…)` statement, read back in the same
    /// round trip; shared ones (a few: the readers of a registry share one hold) one
    /// transaction each, at once.
    async fn extend_all(&self, batch: Vec<Renewal>) -> Result<Vec<bool>> {
        let mut extended = vec![false; batch.len()];
        let shared: Vec<usize> = (0..batch.len())
            .filter(|&i| matches!(place(&batch[i].name), Place::Shared(_)))
            .collect();
        let renewed = futures_util::future::join_all(
            shared
                .iter()
                .map(|&i| self.extend_token(&batch[i].name, batch[i].token, batch[i].lease)),
        )
        .await;
        for (&i, r) in shared.iter().zip(renewed) {
            extended[i] = r?;
        }
        let idents: Vec<Option<Renewed>> = batch
            .iter()
            .map(|r| match place(&r.name) {
                Place::Shared(_) => None,
                Place::Row => self
                    .row_key(&r.name)
                    .ok()
                    .map(|(a, b)| (a, b, self.owner(&r.name, r.token), lease_ms(r.lease))),
            })
            .collect();
        let valid: Vec<(usize, &Renewed)> = idents
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
            let sql = self.sql.extend_many(&locks);
            let out = self.run("extend_many", &sql, true).await?;
            for row in &out.rows {
                if let Some(i) = int(row, 0).and_then(|i| usize::try_from(i).ok()) {
                    if let Some((original, _)) = chunk.get(i) {
                        extended[*original] = true;
                    }
                }
            }
        }
        Ok(extended)
    }
}

impl MySqlBackend {
    /// One attempt (see [`Backend::acquire`](crate::Backend::acquire)); `queued` for a caller that will wait: its
    /// acquisitions take the doorbell in the same round trip.
    async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (token, lease, queued) = (request.token, request.lease, request.queued());
        server::acquire(&self.inner, request, move |inner, name| async move {
            inner.check_kind(&name)?;
            if let Place::Shared(share) = place(&name) {
                return inner.take_share(&name, token, lease, share).await;
            }
            let (a, b) = inner.row_key(&name)?;
            let owner = inner.owner(&name, token);
            let lock = MyLock {
                region: &a,
                key: &b,
                token: &owner,
            };
            let doorbell = inner.doorbell(&a, &b);
            let mut outcome = None;
            let mut armed = false;
            if !inner.options.spring {
                // Behind another process in the lock's queue: leave a free lock to it for a
                // while (it is being woken), which keeps the handoff first come, first served
                // even when this waiter's polling comes first.
                let defer = queued && inner.doorbells.behind(&doorbell);
                let mut rung = None;
                if queued && inner.doorbells.recently_contended(&doorbell) {
                    // Take the doorbell in the same round trip, on the session that will give
                    // it back with the release.
                    if let Some(sql) =
                        inner
                            .sql
                            .acquire_existing(
                                &lock,
                                lease_ms(lease),
                                WANT_WINDOW_MS,
                                defer.then_some(HEAD_GRACE_MS),
                            )
                    {
                        match inner
                            .doorbells
                            .exec(&doorbell, sql, Ring::ArmIfAcquired)
                            .await
                        {
                            Ok(e) => {
                                armed = true;
                                rung = Some(e);
                            }
                            Err(Failed { error, .. })
                                if !matches!(classify(&error), Class::Permanent) =>
                            {
                                // The statement is idempotent for the same token: try it
                                // again without the doorbell, with the usual retries.
                                tracing::debug!(%error, "acquisition with the doorbell failed; again without");
                            }
                            Err(Failed { error, .. }) => {
                                return Err(inner.error("try_acquire", &error))
                            }
                        }
                    }
                }
                let out = match rung {
                    Some(out) => out,
                    None => {
                        let p = if defer {
                            &inner.acquire_deferring
                        } else {
                            &inner.acquire_prepared
                        };
                        inner
                            .run_prepared("try_acquire", p, &lock, lease_ms(lease), true)
                            .await?
                    }
                };
                if out.affected > 0 {
                    outcome = out.last_insert_id.and_then(MyOutcome::decode);
                    if outcome.is_none() {
                        return Err(Error::backend(
                            KIND,
                            "the server did not report the acquisition's outcome",
                        ));
                    }
                }
            }
            let outcome = match outcome {
                Some(o) => o,
                None => {
                    // First use of the key (no row yet), or the Spring layout (whose key name
                    // goes along, the first time, for `list`).
                    let mut sql = inner.sql.acquire(&lock, lease_ms(lease), WANT_WINDOW_MS);
                    let named = inner.name_to_record(&name, &a, &b);
                    if let Some(n) = &named {
                        sql = format!("{n};\n{sql}");
                    }
                    let out = inner.run("try_acquire", &sql, true).await?;
                    if named.is_some() {
                        inner.recorded_name(&a, &b);
                    }
                    let Some(row) = out.rows.first() else {
                        return Ok(Attempt::Busy { retry_after: None });
                    };
                    if int(row, 0).unwrap_or(0) > 0 {
                        MyOutcome::Acquired {
                            fence: int(row, 1).unwrap_or(0),
                            // A new row was wanted by nobody; Spring's table cannot say.
                            wanted: inner.options.spring,
                        }
                    } else {
                        MyOutcome::Busy {
                            remaining_ms: int(row, 2).unwrap_or(0),
                            read_shared: int(row, 3).unwrap_or(0) > 0,
                        }
                    }
                }
            };
            let (fence, wanted) = match outcome {
                MyOutcome::Acquired { fence, wanted } => (fence, wanted),
                MyOutcome::Busy {
                    remaining_ms,
                    read_shared,
                } => {
                    inner.doorbells.note_contended(&doorbell);
                    if queued && read_shared {
                        // A waiting writer keeps new readers out.
                        inner.writer_place(&lock, token, false).await;
                    }
                    return Ok(Attempt::Busy {
                        retry_after: Some(millis(remaining_ms)),
                    });
                }
            };
            if inner.writers.has(token) {
                inner.writer_place(&lock, token, true).await;
            }
            // Ring the doorbell for waiters when there are (or lately were) any; a waiter that
            // comes later finds it silent and looks at the row now and then instead. Armed
            // within the attempt, so that the undo's release (if the caller went away) gives
            // the doorbell back after this takes it.
            inner.doorbells.acquired(&doorbell);
            if wanted {
                inner.doorbells.note_contended(&doorbell);
                if !armed {
                    inner.doorbells.arm(doorbell);
                }
            }
            Ok(Attempt::Acquired {
                fence: fence_from(KIND, fence)?,
            })
        })
        .await
    }
}

server_backend!(MySqlBackend);

impl MySqlBackend {
    fn caps(&self) -> Capabilities {
        // Waiting processes queue on the lock's doorbell turnstile, which the server grants in
        // arrival order: one process is woken per release, first come, first served. A
        // waiter's fallback poll that finds the row free between two rings can still take it
        // first. Spring mode queues nobody (Spring's clients would not respect the turnstile),
        // so it promises no order.
        capabilities(KIND, &self.inner.options).fifo(!self.inner.options.spring)
    }

    /// Releases made through this backend (or its clones) fire the subscription at once;
    /// other processes' releases ring the lock's doorbell, on which a waiter connection
    /// listens while anybody is subscribed.
    async fn subscribe_waiter(&self, name: &LockName) -> Result<ReleaseSubscription> {
        let _ = self.inner.signals.take_idle(1024);
        let ch = channel(name);
        let sub = self.inner.signals.subscribe(&ch).0;
        let i = &self.inner;
        let (a, b) = i.row_key(name)?;
        let doorbell = i.doorbell(&a, &b);
        let sql = i.sql.doorbell_wait(
            &MyLock {
                region: &a,
                key: &b,
                token: "",
            },
            &doorbell,
            LISTEN_WAIT_S,
        );
        i.doorbells.listen(doorbell, ch, sql, &i.signals);
        Ok(sub)
    }
}
