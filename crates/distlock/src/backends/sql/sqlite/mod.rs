//! SQLite backend: a lease table in one database file, so that the processes of one machine
//! exclude each other with no server to run. It is the embedded default of the `distlock` CLI.
//!
//! # Layout
//!
//! One table (default `distlock_locks`), in the spirit of Spring Integration's
//! `JdbcLockRegistry`, created on first use with `CREATE TABLE IF NOT EXISTS`:
//!
//! | column       | type             | meaning                                              |
//! |--------------|------------------|------------------------------------------------------|
//! | `region`     | TEXT, key        | the registry's prefix ([`LockName::prefix`])         |
//! | `lock_key`   | TEXT, key        | the caller's key ([`LockName::key`])                 |
//! | `token`      | TEXT, nullable   | the holder's owner token (32 hex digits), NULL when free |
//! | `fence`      | INTEGER NOT NULL | fence of the latest acquisition                      |
//! | `created_ms` | INTEGER          | when the latest acquisition happened (Unix ms)       |
//! | `expires_ms` | INTEGER          | when the current lease ends (Unix ms)                |
//! | `owner`      | TEXT, nullable   | the holder's [`Owner`](crate::Owner) description, NULL when free or written by an older client (shown as `unknown`); added to an older table on open |
//!
//! Rows stay after release (with `token` NULL) so that the fence keeps increasing per key.
//!
//! Read holds and semaphore permits ([`LockKind`](crate::LockKind)) have a row each in the
//! holds table `<table>_holds` (region, key, token, kind, permits, lease end, fence), with the
//! key's row marked shared (`token` = `shared:read` / `shared:semaphore`) and holding the
//! longest of their leases, so that an exclusive attempt finds the key busy; a writer's
//! token is written in upper case. The layout and its rules are those of the server
//! databases, described in [`sql`](super) and docs/BACKENDS.md.
//!
//! # Clock, fencing and limits
//!
//! - Every time is taken from SQLite's own clock inside the SQL statement, never from the
//!   caller's, so all processes sharing the file agree on when a lease ends.
//! - Fences are [`Fencing::Monotonic`](crate::Fencing::Monotonic): they strictly increase per
//!   key as long as the database file lives. Deleting the file starts them again at 1.
//! - There are no release notifications across processes: waiters in other processes poll
//!   (the registry does that). Releases made through this backend wake waiters of the same
//!   process at once.
//! - SQLite's file locking is only reliable on a local file system. Do not put the database on
//!   NFS or SMB, and do not delete it while processes use it (they would keep writing to the
//!   deleted file and stop excluding the others).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use self::kinds::ShareOutcome;
use self::open::{
    map_error, needs_reopen, open_connection, parse_url, setup, validate_busy_timeout,
    validate_table,
};
use super::dialect::Lite as Statements;
use super::kinds::{self as layout, disagreement, place, row_owner, HeldRow, Place, WriterPlaces};
#[cfg(test)]
use super::MAX_LEASE_MS;
use super::{channel, fence_from, lease_ms, millis, per_entry};
use crate::backend::{
    detached_attempt, AcquireRequest, Attempt, Backend, Capabilities, ListedLock, LockInfo,
    LockName, ReleaseSignals, ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};

const KIND: &str = "sqlite";

pub use super::DEFAULT_TABLE;

/// How long a statement waits for another process's write lock on the file by default.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Options for [`SqliteBackend::open_with`].
///
/// ```
/// use std::time::Duration;
/// use distlock::backends::sqlite::SqliteOptions;
/// let options = SqliteOptions::default().table("my_locks").busy_timeout(Duration::from_secs(2));
/// assert_eq!(options.table, "my_locks");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// The lease table: ASCII letters, digits and `_`, not starting with a digit or `sqlite_`.
    /// Default [`DEFAULT_TABLE`].
    pub table: String,
    /// How long a statement waits for another process's write lock before the operation fails
    /// with the retryable [`Error::Unavailable`]. Default [`DEFAULT_BUSY_TIMEOUT`].
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            table: DEFAULT_TABLE.to_owned(),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }
}

impl SqliteOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lease table's name (checked when the backend is opened).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Sets how long a statement waits for another process's write lock.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }
}

/// The connection, taken out while in use so that a panic or an I/O error leaves `None`
/// behind and the next operation reopens the file.
struct Slot {
    conn: Option<Connection>,
    /// Whether journal mode and table were set up on `conn`.
    ready: bool,
}

struct Inner {
    path: PathBuf,
    table: String,
    busy_timeout: Duration,
    sql: Statements,
    slot: Mutex<Slot>,
    signals: ReleaseSignals,
    writers: WriterPlaces,
}

/// Locks in a SQLite database file, shared by every process that opens the same file.
///
/// Build it with [`SqliteBackend::open`], [`SqliteBackend::open_with`] or
/// [`SqliteBackend::from_url`] (`sqlite:///abs/path.db`). Cloning is cheap and shares the
/// connection. See the [module docs](self) for the table layout and the limits.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use std::time::Duration;
/// use distlock::{backends::sqlite::SqliteBackend, AcquireRequest, Attempt, Backend};
/// use distlock::{LockName, Token};
/// let dir = tempfile::tempdir().expect("temporary directory");
/// let backend = SqliteBackend::open(dir.path().join("locks.db"))?;
/// let name = LockName::new("lock", "job:nightly")?;
/// let token = Token::random();
/// let request = AcquireRequest::new(name.clone(), token, Duration::from_secs(30));
/// let attempt = backend.acquire(&request).await?;
/// assert_eq!(attempt, Attempt::Acquired { fence: 1 });
/// assert!(backend.release(&name, token).await?.was_held);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("path", &self.inner.path)
            .field("table", &self.inner.table)
            .finish()
    }
}

impl SqliteBackend {
    /// Opens (creating it and its parent directory if missing) the database at `path` with the
    /// default [`SqliteOptions`]. A relative path is resolved against the current directory now.
    ///
    /// This opens the file synchronously, which takes well under a millisecond; the table is
    /// created by the first lock operation.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Like [`open`](Self::open), with explicit options.
    ///
    /// Fails with [`Error::InvalidConfig`] for an empty path, a path naming a directory, a bad
    /// table name or a busy timeout above `i32::MAX` milliseconds, and with
    /// [`Error::Unavailable`] when the directory or file cannot be created or opened.
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref();
        validate_table(&options.table)?;
        validate_busy_timeout(options.busy_timeout)?;
        if path.as_os_str().is_empty() {
            return Err(Error::config("sqlite: the database path is empty"));
        }
        // Absolute now, so that a later reopen finds the same file even if the current
        // directory changed in between.
        let path = std::path::absolute(path).map_err(|e| {
            Error::config(format!(
                "sqlite: cannot resolve the path {}: {e}",
                path.display()
            ))
        })?;
        if path.is_dir() {
            return Err(Error::config(format!(
                "sqlite: the path {} is a directory, not a database file",
                path.display()
            )));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::unavailable(
                    KIND,
                    format!("cannot create directory {}: {e}", dir.display()),
                )
            })?;
        }
        // Opened here, not lazily, so that a wrong path is reported by the constructor.
        let conn = open_connection(&path, options.busy_timeout)
            .map_err(|e| map_error("open", &path, &e))?;
        Ok(SqliteBackend {
            inner: Arc::new(Inner {
                sql: Statements::new(&options.table),
                path,
                table: options.table,
                busy_timeout: options.busy_timeout,
                slot: Mutex::new(Slot {
                    conn: Some(conn),
                    ready: false,
                }),
                signals: ReleaseSignals::default(),
                writers: WriterPlaces::default(),
            }),
        })
    }

    /// Opens the database named by a URL: `sqlite:///abs/path.db`, optionally followed by
    /// `?table=NAME`. The path must be absolute (three slashes); characters such as `?`, `#`,
    /// `%` or spaces in it are written percent-encoded.
    ///
    /// A malformed URL gives [`Error::InvalidConfig`] naming the part that is wrong.
    pub fn from_url(url: &str) -> Result<Self> {
        let (path, options) = parse_url(url)?;
        Self::open_with(path, options)
    }

    /// The absolute path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// Runs `f` on the connection in tokio's blocking pool: SQLite calls block, up to the busy
    /// timeout when another process holds the write lock.
    async fn run<T, F>(&self, op: &'static str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Arc<Inner>, &mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        match tokio::task::spawn_blocking(move || inner.with_conn(op, f)).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err(Error::backend(
                KIND,
                format!("{op}: the database task panicked"),
            )),
            Err(_) => Err(Error::unavailable(
                KIND,
                format!("{op}: the database task was cancelled (runtime shutting down)"),
            )),
        }
    }
}

impl Inner {
    /// Runs `f` with the (re)opened, set-up connection. Blocks.
    fn with_conn<T>(
        self: &Arc<Self>,
        op: &str,
        f: impl FnOnce(&Arc<Inner>, &mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        let mut conn = match slot.conn.take() {
            Some(conn) => conn,
            None => {
                slot.ready = false;
                open_connection(&self.path, self.busy_timeout)
                    .map_err(|e| map_error(op, &self.path, &e))?
            }
        };
        let result = if slot.ready {
            f(self, &mut conn)
        } else {
            setup(&mut conn, &self.sql, self.busy_timeout).and_then(|()| {
                slot.ready = true;
                f(self, &mut conn)
            })
        };
        match result {
            Ok(value) => {
                slot.conn = Some(conn);
                Ok(value)
            }
            Err(e) => {
                if !needs_reopen(&e) {
                    slot.conn = Some(conn);
                }
                Err(map_error(op, &self.path, &e))
            }
        }
    }
}

/// The row of a name: (region, key).
fn ident(name: &LockName) -> (String, String) {
    (name.prefix().to_owned(), name.key().to_owned())
}

/// Reads one row of the inspect and list statements, from column `at` on.
fn held_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<HeldRow> {
    Ok(HeldRow {
        token: r.get(at)?,
        fence: r.get(at + 1)?,
        remaining_ms: r.get(at + 2)?,
        shares: r.get(at + 3)?,
        permits: r.get(at + 4)?,
        share_remaining_ms: r.get(at + 5)?,
        writers: r.get(at + 6)?,
        share_owners: stored_bytes(r, at + 7)?,
        owner: stored_bytes(r, at + 8)?,
    })
}

/// A description column as bytes, whatever type another writer gave the value.
fn stored_bytes(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Option<Vec<u8>>> {
    use rusqlite::types::ValueRef;
    Ok(match r.get_ref(at)? {
        ValueRef::Null => None,
        ValueRef::Text(b) | ValueRef::Blob(b) => Some(b.to_vec()),
        ValueRef::Integer(i) => Some(i.to_string().into_bytes()),
        ValueRef::Real(f) => Some(f.to_string().into_bytes()),
    })
}

impl SqliteBackend {
    /// An exclusive attempt (mutex or writer) on the key's row. A waiting writer that finds
    /// readers in takes a place in the holds table, which keeps new readers out; its
    /// acquisition gives the place back.
    async fn attempt_row(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let (region, key) = ident(name);
        let (owner, lease_ms) = (row_owner(name, token), lease_ms(lease));
        let described = request.owner_str().to_owned();
        let (queued, waiter) = (request.queued(), token.to_string());
        self.run("try_acquire", move |inner, conn| {
            // IMMEDIATE takes the write lock up front: the Busy branch reads the holder's
            // expiry in the same snapshot, and a WAL read transaction could not be upgraded.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let fence: Option<i64> = tx
                .prepare_cached(&inner.sql.acquire)?
                .query_row(params![region, key, owner, lease_ms, described], |r| {
                    r.get(0)
                })
                .optional()?;
            let step = match fence {
                Some(fence) => {
                    if inner.writers.take(token) {
                        tx.prepare_cached(&inner.sql.leave)?
                            .execute(params![region, key, waiter])?;
                    }
                    Ok(fence)
                }
                None => {
                    let row: Option<(i64, Option<String>, i64)> = tx
                        .prepare_cached(&inner.sql.remaining)?
                        .query_row(params![region, key], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                        })
                        .optional()?;
                    if let Some((remaining, Some(holder), now)) = &row {
                        if queued && holder == layout::READ_MARK && *remaining > 0 {
                            tx.prepare_cached(&inner.sql.writer_place)?
                                .execute(params![
                                    region,
                                    key,
                                    waiter,
                                    now + layout::WRITER_PLACE_MS
                                ])?;
                            inner.writers.taken(token);
                        }
                    }
                    Err(row.map(|r| r.0))
                }
            };
            tx.commit()?;
            Ok(step)
        })
        .await
        .and_then(|step| match step {
            Ok(fence) => Ok(Attempt::Acquired {
                fence: fence_from(KIND, fence)?,
            }),
            Err(remaining_ms) => Ok(Attempt::Busy {
                retry_after: remaining_ms.map(millis),
                ahead: None,
            }),
        })
    }

    /// A read hold or a permit (see `kinds.rs`).
    async fn attempt_share(
        &self,
        request: &AcquireRequest,
        share: layout::Share,
    ) -> Result<Attempt> {
        let name = request.name.clone();
        let (region, key) = ident(&name);
        let (token, lease_ms) = (request.token.to_string(), lease_ms(request.lease));
        let described = request.owner_str().to_owned();
        let outcome = self
            .run("try_acquire", move |inner, conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let outcome = kinds::acquire(
                    &tx,
                    &inner.sql,
                    (&region, &key),
                    (&token, &described),
                    share,
                    lease_ms,
                )?;
                tx.commit()?;
                Ok(outcome)
            })
            .await?;
        match outcome {
            ShareOutcome::Acquired(fence) => Ok(Attempt::Acquired {
                fence: fence_from(KIND, fence)?,
            }),
            ShareOutcome::Busy(ms) => Ok(Attempt::Busy {
                retry_after: ms.map(millis),
                ahead: None,
            }),
            ShareOutcome::Disagree(theirs) => Err(disagreement(&name, theirs)),
        }
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(KIND).all_kinds().owners(true)
    }

    /// SQLite has no wait queue: both modes make the same attempt (a waiting writer also
    /// keeps new readers out). It runs as its own task (the blocking call cannot be stopped
    /// anyway), and an attempt whose caller went away gives the lock back at once instead of
    /// keeping it until its lease ends.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (this, undo) = (self.clone(), self.clone());
        let (undo_name, token) = (request.name.clone(), request.token);
        let request = request.clone();
        let attempt = async move {
            match place(&request.name) {
                Place::Row => this.attempt_row(&request).await,
                Place::Shared(share) => this.attempt_share(&request, share).await,
            }
        };
        detached_attempt(KIND, String::new, None, attempt, move || async move {
            let _ = undo.release(&undo_name, token).await;
        })
        .await
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let (region, key) = ident(name);
        let was_held = match place(name) {
            Place::Row => {
                let owner = row_owner(name, token);
                self.run("release", move |inner, conn| {
                    Ok(conn
                        .prepare_cached(&inner.sql.release)?
                        .execute(params![region, key, owner])?
                        > 0)
                })
                .await?
            }
            Place::Shared(_) => {
                let token = token.to_string();
                self.run("release", move |inner, conn| {
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let gone = kinds::release(&tx, &inner.sql, (&region, &key), &token)?;
                    tx.commit()?;
                    Ok(gone)
                })
                .await?
            }
        };
        if was_held {
            self.inner.signals.fire(&channel(name));
        }
        Ok(Released {
            was_held,
            contended: false,
        })
    }

    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let mut results = self
            .extend_many(&[Renewal {
                name: name.clone(),
                token,
                lease,
            }])
            .await;
        results.pop().unwrap_or(Ok(false))
    }

    /// All renewals in one IMMEDIATE transaction: one write lock and one commit (one fsync)
    /// for the whole batch. If the transaction fails, every entry reports the error, since
    /// none of its extensions took effect.
    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        if batch.is_empty() {
            return Vec::new();
        }
        let items: Vec<(String, String, String, i64, bool)> = batch
            .iter()
            .map(|r| {
                let (region, key) = ident(&r.name);
                let shared = matches!(place(&r.name), Place::Shared(_));
                let owner = if shared {
                    r.token.to_string()
                } else {
                    row_owner(&r.name, r.token)
                };
                (region, key, owner, lease_ms(r.lease), shared)
            })
            .collect();
        let count = items.len();
        let result = self
            .run("extend_many", move |inner, conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let mut extended = Vec::with_capacity(items.len());
                for (region, key, owner, lease_ms, shared) in &items {
                    extended.push(if *shared {
                        kinds::extend(&tx, &inner.sql, (region, key), owner, *lease_ms)?
                    } else {
                        tx.prepare_cached(&inner.sql.extend)?
                            .execute(params![region, key, owner, lease_ms])?
                            > 0
                    });
                }
                tx.commit()?;
                Ok(extended)
            })
            .await;
        per_entry(KIND, count, result)
    }

    /// Only releases made through this backend (or its clones) fire the subscription; other
    /// processes' releases are found by the registry's polling.
    async fn subscribe(&self, name: &LockName, _waiter: Token) -> Result<ReleaseSubscription> {
        Ok(self.inner.signals.subscribe(&channel(name)).0)
    }

    /// Gives back a waiting writer's place (if it took one: only writers that found readers
    /// in do), and lets the readers it kept out try again.
    async fn leave_queue(&self, name: &LockName, token: Token) -> Result<()> {
        if !self.inner.writers.take(token) {
            return Ok(());
        }
        let (region, key) = ident(name);
        let waiter = token.to_string();
        self.run("leave_queue", move |inner, conn| {
            conn.prepare_cached(&inner.sql.leave)?
                .execute(params![region, key, waiter])
        })
        .await?;
        self.inner.signals.fire(&channel(name));
        Ok(())
    }

    /// Frees a lock whoever holds it (every holder, of any kind); the fence is kept. Waiters
    /// of this process are woken.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let (region, key) = ident(name);
        let existed = self
            .run("force_release", move |inner, conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let existed = kinds::force(&tx, &inner.sql, (&region, &key))?;
                tx.commit()?;
                Ok(existed)
            })
            .await?;
        self.inner.signals.fire(&channel(name));
        Ok(existed)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (region, key) = ident(name);
        let row = self
            .run("inspect", move |inner, conn| {
                conn.prepare_cached(&inner.sql.inspect)?
                    .query_row(params![region, key], |r| held_row(r, 0))
                    .optional()
            })
            .await?;
        match row {
            Some(row) => row.info(KIND),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let region = prefix.to_owned();
        let rows = self
            .run("list", move |inner, conn| {
                let mut stmt = conn.prepare_cached(&inner.sql.list)?;
                let rows = stmt.query_map(params![region], |r| {
                    Ok((r.get::<_, String>(0)?, held_row(r, 1)?))
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })
            .await?;
        let mut listed = Vec::with_capacity(rows.len());
        for (key, row) in rows {
            if let Some(info) = row.info(KIND)? {
                listed.push(ListedLock { key, info });
            }
        }
        Ok(listed)
    }
}

// One job per file, so that each reads on its own: `open` opens the file and sorts SQLite's
// errors, `kinds` runs the shared holds.
mod kinds;
mod open;
#[cfg(test)]
mod tests;
