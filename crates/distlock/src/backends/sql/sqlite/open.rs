//! Opening the file: the `sqlite://` URL, the checks of the table name and busy timeout,
//! the connection's set-up (WAL, the table), and which SQLite errors may pass.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use super::{SqliteOptions, KIND};
use crate::backends::sql::dialect::Lite as Statements;
use crate::error::{Error, Result};
use crate::url::{percent_decode, Params};

pub(super) const MAX_TABLE_LEN: usize = 128;

pub(super) fn open_connection(path: &Path, busy_timeout: Duration) -> rusqlite::Result<Connection> {
    // Without SQLITE_OPEN_URI, so that a file whose name starts with `file:` is just a file.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    // Validated to fit in i32 milliseconds, where rusqlite would otherwise panic.
    conn.busy_timeout(busy_timeout)?;
    Ok(conn)
}

/// Runs once per connection; idempotent, so several processes starting at once on a fresh file
/// all succeed.
///
/// The busy handler alone is not enough here: while the file is still in rollback-journal mode,
/// SQLite answers SQLITE_BUSY at once (without waiting) to a connection that would have to
/// upgrade a read lock another writer is waiting behind, which is exactly what concurrent
/// first uses do. So BUSY is retried until the busy timeout is spent.
pub(super) fn setup(
    conn: &mut Connection,
    sql: &Statements,
    patience: Duration,
) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + patience;
    let mut pause = Duration::from_millis(1);
    loop {
        match setup_once(conn, sql) {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            done => return done,
        }
    }
}

fn setup_once(conn: &mut Connection, sql: &Statements) -> rusqlite::Result<()> {
    // WAL lets `inspect` read while another process writes. The mode is kept in the file; on a
    // file system without shared memory SQLite keeps its old mode, which is still correct.
    // `synchronous` stays at its default (FULL) so that a power cut cannot lose a fence.
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    }
    // IMMEDIATE takes the write lock before the schema is read, so two creators queue on the
    // busy handler instead of deadlocking on a lock upgrade.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(&sql.create)?;
    // A table made before owners were recorded gets the column; rows without it show
    // "unknown".
    for (has, add) in &sql.owner_column {
        let n: i64 = tx.query_row(has, [], |r| r.get(0))?;
        if n == 0 {
            tx.execute_batch(add)?;
        }
    }
    tx.commit()
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Errors after which the connection is not trusted any more: the next operation reopens.
pub(super) fn needs_reopen(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(
            ErrorCode::SystemIoFailure
                | ErrorCode::CannotOpen
                | ErrorCode::FileLockingProtocolFailed
                | ErrorCode::NotADatabase
        )
    )
}

/// Lock contention on the file and I/O trouble may pass; everything else will not.
pub(super) fn map_error(op: &str, path: &Path, e: &rusqlite::Error) -> Error {
    let message = format!("{op} on {}: {e}", path.display());
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::DiskFull
            | ErrorCode::FileLockingProtocolFailed,
        ) => Error::unavailable(KIND, message),
        _ => Error::backend(KIND, message),
    }
}

pub(super) fn validate_table(table: &str) -> Result<()> {
    let mut chars = table.chars();
    let Some(first) = chars.next() else {
        return Err(Error::config("sqlite: the table name is empty"));
    };
    if table.len() > MAX_TABLE_LEN {
        return Err(Error::config(format!(
            "sqlite: the table name is {} characters long; at most {MAX_TABLE_LEN} are allowed",
            table.len()
        )));
    }
    if !(first.is_ascii_alphabetic() || first == '_')
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(Error::config(format!(
            "sqlite: the table name {table:?} must be ASCII letters, digits and '_', \
             not starting with a digit"
        )));
    }
    if table
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("sqlite_"))
    {
        return Err(Error::config(format!(
            "sqlite: the table name {table:?} starts with 'sqlite_', which SQLite reserves"
        )));
    }
    Ok(())
}

pub(super) fn validate_busy_timeout(timeout: Duration) -> Result<()> {
    if timeout.as_millis() > i32::MAX as u128 {
        return Err(Error::config(format!(
            "sqlite: the busy timeout {timeout:?} is too long; at most {} ms",
            i32::MAX
        )));
    }
    Ok(())
}

/// Splits `sqlite:///abs/path.db[?table=NAME]` into a path and options.
pub(super) fn parse_url(url: &str) -> Result<(PathBuf, SqliteOptions)> {
    const SCHEME: &str = "sqlite:";
    let scheme_ok = url
        .get(..SCHEME.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(SCHEME));
    if !scheme_ok {
        let shown = url.split_once(':').map_or("(none)", |(s, _)| s);
        return Err(Error::config(format!(
            "sqlite URL: the scheme must be 'sqlite', got {shown:?} (expected sqlite:///abs/path.db)"
        )));
    }
    let rest = &url[SCHEME.len()..];
    let Some(rest) = rest.strip_prefix("//") else {
        return Err(Error::config(
            "sqlite URL: the path must be absolute and follow 'sqlite://' \
             (expected sqlite:///abs/path.db)",
        ));
    };
    if rest.contains('#') {
        return Err(Error::config(
            "sqlite URL: a fragment ('#...') is not allowed; percent-encode '#' in the path as %23",
        ));
    }
    let (raw_path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if raw_path.is_empty() {
        return Err(Error::config(
            "sqlite URL: the path is missing (expected sqlite:///abs/path.db)",
        ));
    }
    if !raw_path.starts_with('/') {
        let host = raw_path.split('/').next().unwrap_or(raw_path);
        return Err(Error::config(format!(
            "sqlite URL: the path must be absolute, but {host:?} stands where a host would \
             (write three slashes: sqlite:///abs/path.db)"
        )));
    }
    let decoded = percent_decode(raw_path).ok_or_else(|| {
        Error::config(format!(
            "sqlite URL: the path {raw_path:?} has a malformed percent-escape"
        ))
    })?;
    if decoded.ends_with('/') {
        return Err(Error::config(format!(
            "sqlite URL: the path {decoded:?} names a directory, not a database file"
        )));
    }
    if decoded.contains('\0') {
        return Err(Error::config(
            "sqlite URL: the path contains a NUL character",
        ));
    }
    // `sqlite:///C:/x.db` on Windows: drop the slash before the drive letter.
    let decoded = if cfg!(windows) && decoded.as_bytes().get(2) == Some(&b':') {
        decoded[1..].to_owned()
    } else {
        decoded
    };
    let path = PathBuf::from(decoded);
    if !path.is_absolute() {
        return Err(Error::config(format!(
            "sqlite URL: the path {} is not absolute",
            path.display()
        )));
    }

    let mut options = SqliteOptions::default();
    let mut params = Params::raw(KIND, query).unique()?;
    if let Some(table) = params.decoded("table")? {
        validate_table(&table).map_err(|e| match e {
            Error::InvalidConfig(m) => Error::config(format!("{m} (query parameter 'table')")),
            other => other,
        })?;
        options.table = table;
    }
    params.finish(&["table"])?;
    Ok((path, options))
}
