//! SQLite statements: the lease table without `wanted_ms`, built once per table.

/// The database's clock in Unix milliseconds. `julianday` works on every SQLite version (unlike
/// `unixepoch('subsec')`); SQLite keeps `'now'` in whole milliseconds, so `ROUND` undoes the
/// floating-point detour exactly. Within one statement every use sees the same instant.
pub(super) const LITE_MS: &str =
    "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

/// SQLite statements of [`backends::sqlite`](crate::backends::sqlite): the same lease table
/// (without `wanted_ms`: SQLite has no other client to wake across processes, and its fences
/// count from 1 per key since the database file is the whole state). Built once per table
/// because the table name cannot be a bound parameter.
#[derive(Debug)]
pub(crate) struct Lite {
    pub(crate) create: String,
    pub(crate) acquire: String,
    pub(crate) remaining: String,
    pub(crate) release: String,
    pub(crate) extend: String,
    pub(crate) inspect: String,
    pub(crate) force_delete: String,
}

impl Lite {
    /// `table` must have passed the SQLite backend's name check; it is quoted all the same.
    pub(crate) fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        Lite {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    region TEXT NOT NULL,
                    lock_key TEXT NOT NULL,
                    token TEXT NULL,
                    fence INTEGER NOT NULL,
                    created_ms INTEGER NOT NULL,
                    expires_ms INTEGER NOT NULL,
                    PRIMARY KEY (region, lock_key)
                )"
            ),
            // One statement decides and writes, so two processes can never both see the row
            // free. `excluded.created_ms` carries this statement's single reading of the clock
            // into the UPDATE branch.
            acquire: format!(
                "INSERT INTO {t} (region, lock_key, token, fence, created_ms, expires_ms)
                 VALUES (?1, ?2, ?3, 1, {LITE_MS}, {LITE_MS} + ?4)
                 ON CONFLICT (region, lock_key) DO UPDATE SET
                     token = excluded.token,
                     fence = {t}.fence + 1,
                     created_ms = excluded.created_ms,
                     expires_ms = excluded.expires_ms
                 WHERE {t}.token IS NULL OR {t}.expires_ms <= excluded.created_ms
                 RETURNING fence"
            ),
            remaining: format!(
                "SELECT expires_ms - {LITE_MS} FROM {t} WHERE region = ?1 AND lock_key = ?2"
            ),
            release: format!(
                "UPDATE {t} SET token = NULL
                 WHERE region = ?1 AND lock_key = ?2 AND token = ?3 AND expires_ms > {LITE_MS}"
            ),
            extend: format!(
                "UPDATE {t} SET expires_ms = {LITE_MS} + ?4
                 WHERE region = ?1 AND lock_key = ?2 AND token = ?3 AND expires_ms > {LITE_MS}"
            ),
            inspect: format!(
                "SELECT fence, expires_ms - {LITE_MS} FROM {t}
                 WHERE region = ?1 AND lock_key = ?2 AND token IS NOT NULL
                   AND expires_ms > {LITE_MS}"
            ),
            force_delete: format!(
                "UPDATE {t} SET token = NULL
                 WHERE region = ?1 AND lock_key = ?2 AND token IS NOT NULL
                   AND expires_ms > {LITE_MS}"
            ),
        }
    }
}
