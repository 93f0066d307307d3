//! SQL lease tables on PostgreSQL, MySQL/MariaDB and SQLite, in the spirit of Spring
//! Integration's `JdbcLockRegistry`: one row per lock, taken and given back by single atomic
//! statements. ([SQLite](sqlite) follows the same design on a local file and shares the
//! helpers of this module; all statements of the three databases live side by side in one
//! private `dialect` module.) This page describes the two server databases.
//!
//! | backend | URL | feature | waiting |
//! |---|---|---|---|
//! | [`postgres::PostgresBackend`] | `postgres://user:pass@host:port/db?…` (also `postgresql://`) | `postgres` | `LISTEN`/`NOTIFY` on release, polling as fallback |
//! | [`mysql::MySqlBackend`] | `mysql://user:pass@host:port/db?…` (also `mariadb://`) | `mysql` | a `GET_LOCK` doorbell per lock, polling as fallback |
//!
//! # The lease table
//!
//! Created on first use, that is when a backend connects (and again should it vanish), with
//! `CREATE TABLE IF NOT EXISTS` after checking that it is missing, so that a pre-created table
//! needs no `CREATE` privilege. On PostgreSQL the creation runs under a transaction-scoped
//! advisory lock so that processes starting together do not trip over each other; MySQL's data
//! dictionary serialises them by itself. Default name `distlock_locks`; [`SqlOptions::table`]
//! and [`SqlOptions::schema`] change it.
//!
//! | column | PostgreSQL | MySQL/MariaDB | meaning |
//! |---|---|---|---|
//! | `region` | `TEXT` | `VARBINARY(256)` | the registry's prefix (or [`SqlOptions::region`]) |
//! | `lock_key` | `TEXT` | `VARBINARY(1024)` | the caller's key, byte for byte (no collation folds `A` into `a`) |
//! | `token` | `TEXT` | `CHAR(32) ascii` | the holder's owner token, `NULL` when free |
//! | `fence` | `BIGINT` | `BIGINT` | fence of the latest acquisition |
//! | `created_ms` | `BIGINT` | `BIGINT` | when it was taken, Unix ms, database clock |
//! | `expires_ms` | `BIGINT` | `BIGINT` | when the lease ends, Unix ms, database clock |
//! | `wanted_ms` | `BIGINT` | `BIGINT` | until when a waiter said it waits (see below) |
//! | `owner` | `TEXT` | `VARBINARY(512)` | the holder's [`Owner`](crate::Owner) description, `NULL` when free or written by an older client (shown as `unknown`); added to an older table at set-up |
//!
//! Primary key `(region, lock_key)`. Rows stay after release (`token` set to `NULL`).
//!
//! - **Clock**: every time comes from the database server's clock inside the statement; the
//!   clients' clocks never matter. A lease is free once `expires_ms` is past on the server.
//! - **Fence**: `GREATEST(fence + 1, server time in µs)`, so it strictly increases per key while
//!   the row lives and keeps increasing when the row or the whole table is lost (as long as the
//!   server's clock does not step back): [`Fencing::MonotonicAcrossDataLoss`](crate::Fencing).
//! - **Acquire** is one round trip: an `UPDATE` of the key's row that takes it when it is free,
//!   expired or already ours, and otherwise leaves it as it is and only marks it wanted; on the
//!   key's first use (no row yet) an `INSERT … ON CONFLICT DO UPDATE` (PostgreSQL) or
//!   `INSERT … ON DUPLICATE KEY UPDATE` (MySQL) with the same logic follows, which is also safe
//!   when several clients create the row at once. On MySQL the outcome of the `UPDATE` comes
//!   back in its OK packet through `LAST_INSERT_ID(expr)`; the rare `INSERT` carries a
//!   `SELECT`. **Release** and **extend** are owner-checked `UPDATE`s; all
//!   renewals of a registry go out as one `UPDATE` statement.
//! - **Waking waiters**: a waiter that finds the lock busy stamps `wanted_ms` (at most every
//!   second). A release that sees the stamp reports the lock as contended (the registry then lets
//!   the waiters go first) and, on PostgreSQL, sends `pg_notify` in the same statement, so the
//!   notification is delivered exactly when the release commits. Each backend listens on one
//!   dedicated connection (`LISTEN` on a channel per table and one of its own); a lost listening
//!   connection is re-established and all waiters re-check. A PostgreSQL waiter for a mutex or
//!   a write lock takes a place in `<table>_waits`, and a release takes the oldest place out
//!   and notifies that waiter's backend alone (see `dialect/pg_wait.rs`). MySQL has no notifications: the holder's backend
//!   keeps a `GET_LOCK` "doorbell" per held lock on one dedicated connection and gives it back
//!   after the release; a waiter blocks in `GET_LOCK` on the doorbell on a dedicated connection
//!   of its own and so wakes within a round trip of the release (see `mysql/doorbell.rs`). The
//!   doorbell only says when to look; the lease table alone says who holds the lock.
//! - **No session state on pooled connections**: lease-table statements use no advisory or
//!   `GET_LOCK` session locks, no temporary tables, no session variables and no open
//!   transactions between statements (MySQL's `LAST_INSERT_ID` value is the only thing a
//!   statement leaves, and nothing reads it before the next statement sets it), so a pooled connection can never carry a lock (or
//!   anything else) to its next borrower, and a connection killed by the server loses nothing:
//!   the next statement runs on a new one. MySQL's statement connections (sessions, never
//!   lent to anybody else) hold the doorbells of the locks the backend holds, and take them
//!   again after a reconnect.
//! - **Transient errors** (deadlock victim `40P01`/1213, serialization failure `40001`, lock
//!   wait timeout, a connection reset or killed) are retried a few times at once on a fresh
//!   connection, then reported as the retryable [`Error::Unavailable`]; the registry retries
//!   those within the caller's deadline. A wrong password is an [`Error::Backend`] that says so,
//!   without the password.
//!
//! # Lock kinds
//!
//! Read-write locks and semaphores ([`LockKind`](crate::LockKind); native layout only) keep
//! one row per holder in a second table, `<table>_holds` (region, key, token, kind,
//! permits, lease end, fence), created with the lease table. The key's row stays the place
//! where every kind meets: while readers or permit holders are in, its `token` is a share
//! mark (`shared:read`, `shared:semaphore`) and its `expires_ms` the longest of their leases,
//! so a mutex attempt (ours, or another client's statement on the row) finds it busy; a
//! writer's token is written in upper case, so that the row tells a writer from a mutex
//! holder. Every change to a key's shares is made under the lock of the key's row. A waiting
//! writer that finds readers in takes a place in the holds table that keeps new readers out
//! until it acquires, leaves the queue or stops renewing it (2 s). Fences come from the key's
//! row for every kind. See docs/BACKENDS.md ("Lock kinds on the SQL backends") for the
//! statements.
//!
//! # Deadlines
//!
//! Every call (an acquisition attempt, a release, a renewal, an inspection) runs as a task of
//! its own and is bounded as a whole by [`SqlOptions::request_timeout`] (URL
//! `request_timeout`, default 5 s): waiting for a pooled connection, connecting, the retries
//! above and the server's reply all count. A renewal is bounded by the lease it renews as well
//! (the registry also stops waiting for it when the lease it protects ends). A call that runs
//! out of time fails with the retryable [`Error::Unavailable`], and the connection it was
//! using is closed, never used again (handed back to the pool, or to the next statement of a
//! MySQL session), where a stalled connection or a late reply would reach the next call. So with the network stalled, `try_lock_for(d)` returns after at
//! most about `max(d, request_timeout)`. The backend does not see the caller's own deadline
//! (the [`Backend`](crate::Backend) methods carry none), which is why a call may outlast a
//! `try_lock_for` wait shorter than `request_timeout`. MySQL's doorbell connections bound
//! each statement in the same way; PostgreSQL's listening connection is checked with a query
//! every 30 s and replaced when it does not answer within `request_timeout`.
//!
//! # Passwords and TLS
//!
//! No password leaves in a readable form, or goes to a server whose certificate was not
//! verified, unless the URL says so with `allow_insecure_auth=true`
//! ([`SqlOptions::allow_insecure_auth`]).
//!
//! - **Verified** means TLS whose certificate chains to a trusted root (the CA file of
//!   `sslrootcert` / `ssl-ca`, else the Mozilla roots) and, except with `verify-ca` /
//!   `verify_ca`, names the host of the URL. A Unix socket (PostgreSQL, through
//!   [`PostgresBackend::connect_with`](postgres::PostgresBackend)) counts as
//!   verified.
//! - **PostgreSQL** (`sslmode`, default `prefer`): `prefer` uses TLS when the server offers
//!   it, `require` insists on it; both check the certificate, and one that fails still
//!   encrypts but leaves the connection unverified. `verify-ca` and `verify-full` fail
//!   without a verified certificate. Over an unverified connection (plain, or TLS that did
//!   not verify) a server that asks for the password in cleartext (`password` in
//!   `pg_hba.conf`) or as an MD5 digest (`md5`, a fast hash that is easy to guess from) is
//!   refused with an [`Error::Backend`] that says why, before anything of the password is
//!   sent. SCRAM-SHA-256 is allowed over any connection: it proves that the client knows the
//!   password without revealing it (an impostor learns no more than a value to run guesses
//!   against, which a strong password defeats); `trust` and client certificates send no
//!   password at all.
//! - **MySQL/MariaDB** (`ssl-mode`; default `preferred` when the URL has a password, else
//!   `disabled`, since there is nothing secret to send): the server chooses the
//!   authentication method, and some reveal the password (`mysql_clear_password`;
//!   `caching_sha2_password`'s full authentication, which sends it in clear over TLS or
//!   encrypts it with an RSA key fetched from the same, unverified server). The driver cannot
//!   be limited to the challenge-response methods, so a non-empty password is only sent over
//!   verified TLS: `preferred` uses TLS when the server offers it and verifies it (with the
//!   host name) when the URL has a password, and refuses to connect with a password when the
//!   server offers no TLS (the driver stops before anything of the password is sent);
//!   `disabled` and `required` (encrypted, not verified) with a password are refused as a
//!   configuration error. Without a password (or with an empty one), an explicit `preferred`
//!   uses TLS when offered without checking the certificate. `preferred` finds out whether
//!   the server offers TLS with one extra connection when the backend connects.
//!   Note: the driver's (`mysql_async`) rustls verifier also checks the host name in
//!   `verify_ca` mode, so `verify_ca` currently behaves as `verify_identity`.
//! - `allow_insecure_auth=true` lifts these limits (and lets MySQL use
//!   `mysql_clear_password`); use it only on a network you trust.
//! - **Client certificates**: `sslcert` and `sslkey` (PostgreSQL), `ssl-cert` and `ssl-key`
//!   (MySQL), PEM files.
//!
//! [`MySqlBackend::connect_with_opts`](mysql::MySqlBackend::connect_with_opts) takes the TLS
//! settings of its `mysql_async` options as given and applies none of these rules.
//!
//! # Spring compatibility
//!
//! [`SqlOptions::spring_compatible`] (URL `?spring=true`) uses Spring Integration's `INT_LOCK`
//! table as its `DefaultLockRepository` does, so that a Spring `JdbcLockRegistry` and distlock
//! on the same database exclude each other:
//!
//! | column | value written by distlock |
//! |---|---|
//! | `LOCK_KEY CHAR(36)` | [`spring_lock_key`]: the key itself if it is a UUID, else `UUID.nameUUIDFromBytes(key UTF-8)` (an MD5, version 3 UUID), as Spring's `UUIDConverter` computes it |
//! | `REGION VARCHAR(100)` | [`SqlOptions::region`], else the registry's prefix, except that the registry's default prefix `lock` becomes Spring's default region `DEFAULT` ([`SPRING_DEFAULT_REGION`]) |
//! | `CLIENT_ID CHAR(36)` | the owner token written as a UUID |
//! | `CREATED_DATE TIMESTAMP` | acquisition time, UTC, database clock |
//! | `EXPIRED_AFTER TIMESTAMP` | end of the lease, UTC, database clock |
//!
//! This is the layout of Spring Integration 7.0 and later (with `EXPIRED_AFTER`, per-lock time
//! to live); the layout of 6.x and earlier (no `EXPIRED_AFTER`, expiry computed from
//! `CREATED_DATE` and a time to live every client must agree on) is not supported. If the table
//! is missing, distlock creates it with Spring's own DDL.
//!
//! A registry that turns Spring mode on and changes nothing else shares its locks with a Spring
//! application that changed nothing either: the registry's default prefix (`lock`, also the
//! CLI's `--prefix` default) is written as Spring's default region `DEFAULT`. A region
//! (`?region=`) or any other prefix is used as given. The default prefix cannot be told from a
//! prefix `lock` given explicitly; write `?region=lock` for a region of that name.
//!
//! Spring deletes the row on release, so there is no column to keep a fence in: in this mode the
//! fence is `CREATED_DATE` in microseconds, which increases from one holder to the next only as
//! far as the database's clock does. The capabilities say [`Fencing::None`](crate::Fencing):
//! do not fence writes with it. Spring's releases send no notification, so distlock waiters
//! notice them by polling (at most every 500 ms); Spring's waiters poll every 100 ms.
//!
//! Spring mode takes the mutex only: Spring's registry has no shared locks to share, and its
//! table no fence column (read-write locks and semaphores answer
//! [`Error::Unsupported`]; use the native layout for them). Since `LOCK_KEY` is an MD5 UUID of
//! the key, distlock records the name of each key it takes in `INT_LOCK_NAMES` (`LOCK_KEY`,
//! `REGION`, `LOCK_NAME`, created with `INT_LOCK`), once per key and backend, so that
//! [`Backend::list`](crate::Backend::list) shows the keys; keys of Spring's own clients are
//! listed by their `LOCK_KEY`.
//!
//! The holders' descriptions ([`LockInfo::owners`](crate::LockInfo)) go to a third table,
//! `INT_LOCK_OWNERS` (`LOCK_KEY`, `REGION`, `CLIENT_ID`, `OWNER`; one row per key), written and
//! deleted with the hold in the same statement (PostgreSQL) or packet (MySQL), so that
//! `INT_LOCK` stays exactly Spring's. A hold of a Spring client shows its `CLIENT_ID`.
//!
//! # ShedLock layout
//!
//! [`SqlOptions::shedlock_compatible`] (URL `?layout=shedlock`) uses ShedLock's table
//! (`shedlock(name VARCHAR(64) PRIMARY KEY, lock_until, locked_at TIMESTAMP(3), locked_by
//! VARCHAR(255))`, default name `shedlock`) with ShedLock's own statements and the database's
//! UTC time, so that ShedLock's JDBC lock provider and distlock exclude each other. The row
//! is never deleted (a release sets `lock_until` to now); `locked_by` is the holder's
//! description followed by ` #<token>`, so that ShedLock (which releases by host name) never
//! releases distlock's hold. The registry's default prefix writes the bare key as `name`,
//! any other prefix `<prefix>:<key>`; a name longer than 64 characters is
//! [`Error::InvalidKey`]. Mutex only, [`Fencing::None`](crate::Fencing). See
//! [`shedlock`] for the statements and the limits.
//!
//! # URL parameters
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `table` | `distlock_locks` (`INT_LOCK` with `spring=true`, `shedlock` with `layout=shedlock`) | the lease table |
//! | `schema` | the connection's default | PostgreSQL schema / MySQL database of the table |
//! | `region` | the registry's prefix (`DEFAULT` for the default prefix `lock` with `spring=true`) | a fixed region for every lock |
//! | `spring` | `false` | Spring `INT_LOCK` layout |
//! | `layout` | `native` | `native`, `spring` (as `spring=true`) or `shedlock` (ShedLock's table, default name `shedlock`) |
//! | `create_table` | `true` | create the table on first use when it is missing |
//! | `pool_size` | 1 | statement connections (plus one listening connection while waiting): a registry needs two connections whatever the number of keys it holds or waits for; more let one process run statements in parallel |
//! | `connect_timeout` | `5s` | per connection attempt; `500ms`, `5s`, `1m` or plain seconds |
//! | `request_timeout` | `5s` | per call, pool wait, connecting, retries and reply included (see [Deadlines](self#deadlines)) |
//! | `allow_insecure_auth` | `false` | send a password even in a readable form or to an unverified server (see [Passwords and TLS](self#passwords-and-tls)) |
//! | `sslmode` (PostgreSQL) | `prefer` | `disable`, `prefer` (TLS if offered, certificate checked), `require` (TLS, certificate checked; one that fails still encrypts, unverified), `verify-ca`, `verify-full` |
//! | `sslrootcert` (PostgreSQL) | the Mozilla roots | PEM file of the CA to verify against |
//! | `sslcert`, `sslkey` (PostgreSQL) | none | client certificate chain and key, PEM |
//! | `ssl-mode` (MySQL) | `preferred` with a password, else `disabled` | `disabled`, `preferred` (TLS if offered; verified when the URL has a password, which is then refused without TLS), `required` (encrypted, not verified), `verify_ca`, `verify_identity` |
//! | `ssl-ca` (MySQL) | the Mozilla roots | PEM file of the CA to verify against |
//! | `ssl-cert`, `ssl-key` (MySQL) | none | client certificate chain and key, PEM |
//! | `application_name` (PostgreSQL) | `distlock` | shown in `pg_stat_activity` |

// With only the `sqlite` feature this module holds just the SQLite statements.
#![cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]

use std::fmt;
use std::time::Duration;

use crate::backend::{LockName, Token};
use crate::error::{Error, Result};
use crate::url::{percent_decode, Params};

#[cfg(feature = "postgres")]
mod auth_guard;
pub(crate) mod dialect;
pub(crate) mod kinds;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod lease_table;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod shedlock;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use self::lease_table::LeaseTable;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// The table used when none is configured.
pub const DEFAULT_TABLE: &str = "distlock_locks";
/// Spring Integration's table (`DefaultLockRepository`'s prefix `INT_` + `LOCK`).
pub const SPRING_TABLE: &str = "INT_LOCK";
/// ShedLock's table (its JDBC provider's default name).
pub const SHEDLOCK_TABLE: &str = "shedlock";
/// The region of Spring mode when neither a region nor a prefix other than the registry's
/// default is given: Spring's `DefaultLockRepository`'s default region.
pub const SPRING_DEFAULT_REGION: &str = "DEFAULT";
/// The registry's default prefix ([`RegistryOptions`](crate::RegistryOptions)' and the CLI's),
/// which Spring mode reads as "no prefix given".
const REGISTRY_DEFAULT_PREFIX: &str = "lock";
/// Default of [`SqlOptions::pool_size`].
pub const DEFAULT_POOL_SIZE: usize = 1;
/// Default of [`SqlOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`SqlOptions::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a waiter's `wanted_ms` stamp lasts; it is renewed when less than half is left.
pub(crate) const WANT_WINDOW_MS: i64 = 2000;
/// How many times an operation is tried at once on a transient error before it is reported.
pub(crate) const ATTEMPTS: usize = 3;
/// The longest lease written (a day is the registry's maximum; this only guards arithmetic:
/// about 35 years, so `now + lease` never overflows a 64-bit column, nor turns SQLite's
/// integer into a float).
pub(crate) const MAX_LEASE_MS: i64 = 1 << 40;
const MAX_IDENT_LEN: usize = 63;
const MAX_REGION_LEN: usize = 256;
const SPRING_MAX_REGION_CHARS: usize = 100;

/// Options of the PostgreSQL and MySQL backends. Every field has a URL parameter of the same
/// name (see the [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use distlock::backends::sql::SqlOptions;
/// let o = SqlOptions::default().table("app_locks").schema("infra").pool_size(4);
/// assert_eq!(o.table, "app_locks");
/// let spring = SqlOptions::spring_compatible().region("DEFAULT");
/// assert_eq!(spring.table, "INT_LOCK");
/// assert!(spring.spring);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlOptions {
    /// The lease table: ASCII letters, digits and `_`, not starting with a digit, at most 63.
    pub table: String,
    /// The schema (PostgreSQL) or database (MySQL) of the table; `None` for the connection's
    /// default (`search_path` / the URL's database).
    pub schema: Option<String>,
    /// A fixed region for every lock instead of the registry's prefix.
    pub region: Option<String>,
    /// Spring Integration's `INT_LOCK` layout (see the [module docs](self#spring-compatibility)).
    pub spring: bool,
    /// ShedLock's `shedlock` table layout (URL `layout=shedlock`; see the
    /// [module docs](self#shedlock-layout)).
    pub shedlock: bool,
    /// Create the table on first use when it is missing (default true).
    pub create_table: bool,
    /// Most statement connections open at once (default [`DEFAULT_POOL_SIZE`]); waiters use
    /// one more, whatever the number of keys they wait for.
    pub pool_size: usize,
    /// Limit of one connection attempt (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub connect_timeout: Duration,
    /// Limit of one whole call (waiting for a pooled connection, connecting, every retry and
    /// the server's reply; default [`DEFAULT_REQUEST_TIMEOUT`]). A renewal is also limited by
    /// the lease it renews. A connection whose statement did not answer in time is closed,
    /// never reused. See the [module docs](self#deadlines).
    pub request_timeout: Duration,
    /// Send a password even where it could be read or replayed: in cleartext (or as an MD5
    /// digest on PostgreSQL) over a connection whose server certificate was not verified, or
    /// at all to a MySQL server that is not verified. Off by default; see the
    /// [module docs](self#passwords-and-tls).
    pub allow_insecure_auth: bool,
}

impl Default for SqlOptions {
    fn default() -> Self {
        SqlOptions {
            table: DEFAULT_TABLE.to_owned(),
            schema: None,
            region: None,
            spring: false,
            shedlock: false,
            create_table: true,
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            allow_insecure_auth: false,
        }
    }
}

impl SqlOptions {
    /// The default options: table `distlock_locks` in the connection's default schema.
    pub fn new() -> Self {
        Self::default()
    }

    /// Spring Integration's `INT_LOCK` table and layout.
    pub fn spring_compatible() -> Self {
        SqlOptions {
            table: SPRING_TABLE.to_owned(),
            spring: true,
            ..Self::default()
        }
    }

    /// ShedLock's `shedlock` table and layout (mutex only; the key is the row's `name`).
    pub fn shedlock_compatible() -> Self {
        SqlOptions {
            table: SHEDLOCK_TABLE.to_owned(),
            shedlock: true,
            ..Self::default()
        }
    }

    /// Whether this is distlock's own layout (neither Spring's nor ShedLock's table).
    pub(crate) fn native(&self) -> bool {
        !self.spring && !self.shedlock
    }

    /// Sets the table name.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Sets the schema (PostgreSQL) or database (MySQL) of the table.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Uses one fixed region for every lock instead of the registry's prefix.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Whether to create the table on first use when it is missing.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Sets the most statement connections open at once.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Sets the limit of one connection attempt.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the limit of one whole call (see [`SqlOptions::request_timeout`]).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Allows sending a password where it could be read (see
    /// [`SqlOptions::allow_insecure_auth`]).
    pub fn allow_insecure_auth(mut self, allow: bool) -> Self {
        self.allow_insecure_auth = allow;
        self
    }

    /// The limit of a renewal: the request timeout, and never past the lease it renews.
    pub(crate) fn renewal_timeout(&self, lease: Duration) -> Duration {
        self.request_timeout
            .min(lease)
            .max(Duration::from_millis(1))
    }

    pub(crate) fn validate(&self, kind: &str) -> Result<()> {
        validate_ident(kind, "table", &self.table)?;
        if let Some(schema) = &self.schema {
            validate_ident(kind, "schema", schema)?;
        }
        if self.spring && self.shedlock {
            return Err(Error::config(format!(
                "{kind}: choose one layout: Spring's INT_LOCK or ShedLock's table, not both"
            )));
        }
        if let Some(region) = &self.region {
            if self.shedlock {
                return Err(Error::config(format!(
                    "{kind}: ShedLock's table has no region; drop the region with layout=shedlock"
                )));
            }
            check_region(kind, self.spring, region)?;
        }
        if self.pool_size == 0 || self.pool_size > 1000 {
            return Err(Error::config(format!(
                "{kind}: pool_size must be between 1 and 1000, got {}",
                self.pool_size
            )));
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > Duration::from_secs(3600) {
            return Err(Error::config(format!(
                "{kind}: connect_timeout must be between 1 ms and 1 hour, got {:?}",
                self.connect_timeout
            )));
        }
        if self.request_timeout.is_zero() || self.request_timeout > Duration::from_secs(3600) {
            return Err(Error::config(format!(
                "{kind}: request_timeout must be between 1 ms and 1 hour, got {:?}",
                self.request_timeout
            )));
        }
        Ok(())
    }

    /// The region a lock lives in.
    pub(crate) fn region_of<'a>(&'a self, name: &'a LockName) -> &'a str {
        self.region_for(name.prefix())
    }

    /// The region of the locks under `prefix`: the configured region, else the prefix, except
    /// that Spring mode maps the registry's default prefix to Spring's default region.
    pub(crate) fn region_for<'a>(&'a self, prefix: &'a str) -> &'a str {
        match &self.region {
            Some(region) => region,
            None if self.spring && prefix == REGISTRY_DEFAULT_PREFIX => SPRING_DEFAULT_REGION,
            None => prefix,
        }
    }
}

fn validate_ident(kind: &str, what: &str, ident: &str) -> Result<()> {
    let mut chars = ident.chars();
    let ok_first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !ok_first
        || ident.len() > MAX_IDENT_LEN
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(Error::config(format!(
            "{kind}: the {what} name {ident:?} must be 1 to {MAX_IDENT_LEN} ASCII letters, \
             digits and '_', not starting with a digit"
        )));
    }
    Ok(())
}

/// Checks a region (a prefix or the configured region) for the layout's column.
pub(crate) fn check_region(kind: &str, spring: bool, region: &str) -> Result<()> {
    if region.is_empty() || region.contains('\0') {
        return Err(Error::config(format!(
            "{kind}: the region must be non-empty and without NUL"
        )));
    }
    if spring && region.chars().count() > SPRING_MAX_REGION_CHARS {
        return Err(Error::config(format!(
            "{kind}: Spring's REGION column holds at most {SPRING_MAX_REGION_CHARS} characters; \
             the region {region:?} is longer"
        )));
    }
    if region.len() > MAX_REGION_LEN {
        return Err(Error::config(format!(
            "{kind}: the region is {} bytes long; at most {MAX_REGION_LEN} are allowed",
            region.len()
        )));
    }
    Ok(())
}

/// The `LOCK_KEY` Spring Integration's `JdbcLockRegistry` stores for `key`: Spring's
/// `UUIDConverter.getUUID(key)`, that is the key itself (lower case) when it already is a UUID
/// in the 8-4-4-4-12 form, else `UUID.nameUUIDFromBytes(key.getBytes(UTF_8))`, the version 3
/// (MD5) name-based UUID.
///
/// ```
/// use distlock::backends::sql::spring_lock_key;
/// // java.util.UUID.nameUUIDFromBytes("foo".getBytes(UTF_8))
/// assert_eq!(spring_lock_key("foo"), "acbd18db-4cc2-385c-adef-654fccc4a4d8");
/// assert_eq!(spring_lock_key("ABCDEF01-2345-6789-ABCD-EF0123456789"), "abcdef01-2345-6789-abcd-ef0123456789");
/// ```
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub fn spring_lock_key(key: &str) -> String {
    if is_uuid(key) {
        return key.to_ascii_lowercase();
    }
    use md5::{Digest, Md5};
    let mut d: [u8; 16] = Md5::digest(key.as_bytes()).into();
    d[6] = (d[6] & 0x0f) | 0x30; // version 3
    d[8] = (d[8] & 0x3f) | 0x80; // IETF variant
    uuid_text(u128::from_be_bytes(d))
}

/// The owner token in the 36-character UUID form of Spring's `CLIENT_ID` column.
pub(crate) fn token_uuid(token: Token) -> String {
    uuid_text(token.as_u128())
}

fn uuid_text(v: u128) -> String {
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Milliseconds for SQL, rounded up (the server's lease must not end before the holder's own
/// reckoning of it), at least 1 (a zero lease would be over as soon as it is written) and
/// capped.
pub(crate) fn lease_ms(lease: Duration) -> i64 {
    let ms = lease.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX).clamp(1, MAX_LEASE_MS)
}

/// A millisecond column as a duration; a negative value (a lease already over) is zero.
pub(crate) fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

pub(crate) fn fence_from(kind: &'static str, fence: i64) -> Result<u64> {
    u64::try_from(fence)
        .map_err(|_| Error::backend(kind, format!("the fence column holds {fence}, not a fence")))
}

/// The same error again, for every entry of a failed batch.
pub(crate) fn duplicate(kind: &'static str, e: &Error) -> Error {
    match e {
        Error::Unavailable { message, .. } => Error::unavailable(kind, message.clone()),
        other => Error::backend(kind, other.to_string()),
    }
}

/// One outcome per entry of a batch of `count`: each entry's own, or the batch's error for
/// every entry.
pub(crate) fn per_entry(
    kind: &'static str,
    count: usize,
    batch: Result<Vec<bool>>,
) -> Vec<Result<bool>> {
    match batch {
        Ok(v) => v.into_iter().map(Ok).collect(),
        Err(e) => (0..count).map(|_| Err(duplicate(kind, &e))).collect(),
    }
}

/// The in-process release channel of a lock; the length prefix keeps `("a:b", "c")` and
/// `("a", "b:c")` apart.
pub(crate) fn channel(name: &LockName) -> String {
    format!("{}:{}:{}", name.prefix().len(), name.prefix(), name.key())
}

/// What a database URL says, split into the parts both drivers need.
pub(crate) struct ParsedUrl {
    pub(crate) host: String,
    pub(crate) port: Option<u16>,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) database: Option<String>,
    pub(crate) options: SqlOptions,
    /// Driver-specific parameters, in order, not yet judged.
    pub(crate) rest: Vec<(String, String)>,
}

impl fmt::Debug for ParsedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParsedUrl")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("database", &self.database)
            .finish()
    }
}

/// Parses `scheme://[user[:password]@]host[:port][/database][?params]`, taking out the
/// parameters common to both SQL backends.
pub(crate) fn parse_url(kind: &str, schemes: &[&str], raw: &str) -> Result<ParsedUrl> {
    let shown = crate::url::redact(raw);
    let url = url::Url::parse(raw)
        .map_err(|e| Error::config(format!("{kind} URL {shown:?} is malformed: {e}")))?;
    if !schemes.contains(&url.scheme()) {
        return Err(Error::config(format!(
            "{kind} URL: the scheme must be one of {}, got {:?}",
            schemes.join(", "),
            url.scheme()
        )));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => d.to_owned(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        _ => {
            return Err(Error::config(format!(
                "{kind} URL {shown:?}: the host is missing (expected {}://user@host:port/database)",
                schemes[0]
            )))
        }
    };
    if url.fragment().is_some() {
        return Err(Error::config(format!(
            "{kind} URL {shown:?}: a fragment ('#...') is not allowed"
        )));
    }
    let decode = |s: &str, part: &str| -> Result<String> {
        percent_decode(s).ok_or_else(|| {
            Error::config(format!(
                "{kind} URL {shown:?}: the {part} has a malformed percent-escape"
            ))
        })
    };
    let user = match url.username() {
        "" => None,
        u => Some(decode(u, "user name")?),
    };
    let password = url.password().map(|p| decode(p, "password")).transpose()?;
    let path = url.path().trim_start_matches('/');
    let database = match path {
        "" => None,
        p if p.contains('/') => {
            return Err(Error::config(format!(
                "{kind} URL {shown:?}: the database name {p:?} must not contain '/'"
            )))
        }
        p => Some(decode(p, "database name")?),
    };
    let mut params = Params::form(kind, url.query()).unique()?;
    let mut options = SqlOptions::default();
    let table = params.string("table");
    options.schema = params.string("schema");
    options.region = params.string("region");
    if let Some(v) = params.bool("spring")? {
        options.spring = v;
    }
    if let Some(layout) = params.string("layout") {
        match layout.as_str() {
            "native" => {}
            "spring" => options.spring = true,
            "shedlock" => options.shedlock = true,
            other => {
                return Err(Error::config(format!(
                    "{kind} URL: layout must be native, spring or shedlock, got {other:?}"
                )))
            }
        }
    }
    if let Some(v) = params.bool("create_table")? {
        options.create_table = v;
    }
    for name in ["pool_size", "pool_max_size"] {
        if let Some(v) = params.integer(name)? {
            options.pool_size = v;
        }
    }
    if let Some(v) = params.duration("connect_timeout")? {
        options.connect_timeout = v;
    }
    if let Some(v) = params.duration("request_timeout")? {
        options.request_timeout = v;
    }
    if let Some(v) = params.bool("allow_insecure_auth")? {
        options.allow_insecure_auth = v;
    }
    let rest = params.into_rest();
    options.table = table.unwrap_or_else(|| {
        if options.shedlock {
            SHEDLOCK_TABLE.to_owned()
        } else if options.spring {
            SPRING_TABLE.to_owned()
        } else {
            DEFAULT_TABLE.to_owned()
        }
    });
    options.validate(kind).map_err(|e| match e {
        Error::InvalidConfig(m) => Error::config(format!("{m} (in the URL's query)")),
        other => other,
    })?;
    Ok(ParsedUrl {
        host,
        port: url.port(),
        user,
        password,
        database,
        options,
        rest,
    })
}

/// Removes every occurrence of `secret` (and its percent-encoded form) from a message.
pub(crate) fn scrub(message: String, secret: Option<&str>) -> String {
    match secret {
        Some(s) if s.len() >= 2 => {
            let encoded: String = url::form_urlencoded::byte_serialize(s.as_bytes()).collect();
            message.replace(s, "***").replace(&encoded, "***")
        }
        _ => message,
    }
}

#[cfg(test)]
mod tests;
