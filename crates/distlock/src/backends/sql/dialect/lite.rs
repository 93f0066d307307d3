//! SQLite statements: the lease table without `wanted_ms` and its holds table, built once per
//! table. The shared kinds run as IMMEDIATE transactions of several of these statements (the
//! write lock covers the whole file, so every statement of one sees the same state), taking
//! the database's clock once (`row`) and passing it on to the others.

use crate::backends::sql::kinds::{
    MAX_SHARE_OWNERS, OWNER_SEP, PERMIT, READ, READ_MARK, SEM_MARK, WRITER,
};

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
    /// Per table: whether it has the `owner` column (a count), and the `ALTER` adding it to a
    /// table made before descriptions were recorded.
    pub(crate) owner_column: Vec<(String, String)>,
    pub(crate) acquire: String,
    pub(crate) remaining: String,
    pub(crate) release: String,
    pub(crate) extend: String,
    pub(crate) inspect: String,
    pub(crate) force_delete: String,
    /// The key's row, created free if missing; then `row` reads it with the clock.
    pub(crate) touch_row: String,
    pub(crate) row: String,
    pub(crate) live_holds: String,
    pub(crate) put_hold: String,
    pub(crate) mark_row: String,
    pub(crate) drop_hold: String,
    pub(crate) settle_row: String,
    pub(crate) extend_hold: String,
    pub(crate) raise_row: String,
    pub(crate) writer_place: String,
    pub(crate) leave: String,
    pub(crate) drop_shares: String,
    pub(crate) list: String,
}

impl Lite {
    /// `table` must have passed the SQLite backend's name check; it is quoted all the same.
    pub(crate) fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        let h = format!("\"{}\"", crate::backends::sql::kinds::holds_table(table));
        let shares = format!("kind IN ('{READ}', '{PERMIT}')");
        let marks = format!("('{READ_MARK}', '{SEM_MARK}')");
        // ?1 region, ?2 key, ?3 now (ms): the live holds of a key, summed up as the inspect
        // and list statements report them.
        let summary = |live: &str| {
            format!(
                "(SELECT COUNT(*) FROM {h} x WHERE {live} AND x.{shares}),
                 (SELECT MAX(x.permits) FROM {h} x WHERE {live} AND x.kind = '{PERMIT}'),
                 (SELECT MAX(x.expires_ms) FROM {h} x WHERE {live} AND x.{shares}) - {LITE_MS},
                 (SELECT COUNT(*) FROM {h} x WHERE {live} AND x.kind = '{WRITER}'),
                 (SELECT group_concat(o.owner, char({sep})) FROM
                     (SELECT COALESCE(x.owner, '') AS owner FROM {h} x
                      WHERE {live} AND x.{shares} LIMIT {MAX_SHARE_OWNERS}) o)",
                sep = OWNER_SEP as u32
            )
        };
        let live =
            format!("x.region = l.region AND x.lock_key = l.lock_key AND x.expires_ms > {LITE_MS}");
        Lite {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    region TEXT NOT NULL,
                    lock_key TEXT NOT NULL,
                    token TEXT NULL,
                    fence INTEGER NOT NULL,
                    created_ms INTEGER NOT NULL,
                    expires_ms INTEGER NOT NULL,
                    owner TEXT NULL,
                    PRIMARY KEY (region, lock_key)
                );
                CREATE TABLE IF NOT EXISTS {h} (
                    region TEXT NOT NULL,
                    lock_key TEXT NOT NULL,
                    token TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    permits INTEGER NOT NULL,
                    expires_ms INTEGER NOT NULL,
                    fence INTEGER NOT NULL,
                    owner TEXT NULL,
                    PRIMARY KEY (region, lock_key, token)
                )"
            ),
            owner_column: [&t, &h]
                .into_iter()
                .map(|x| {
                    let bare = x.trim_matches('"');
                    (
                        format!(
                            "SELECT COUNT(*) FROM pragma_table_info('{bare}') WHERE name = 'owner'"
                        ),
                        format!("ALTER TABLE {x} ADD COLUMN owner TEXT NULL"),
                    )
                })
                .collect(),
            // One statement decides and writes, so two processes can never both see the row
            // free. `excluded.created_ms` carries this statement's single reading of the clock
            // into the UPDATE branch.
            acquire: format!(
                "INSERT INTO {t} (region, lock_key, token, fence, created_ms, expires_ms, owner)
                 VALUES (?1, ?2, ?3, 1, {LITE_MS}, {LITE_MS} + ?4, ?5)
                 ON CONFLICT (region, lock_key) DO UPDATE SET
                     token = excluded.token,
                     owner = excluded.owner,
                     fence = {t}.fence + 1,
                     created_ms = excluded.created_ms,
                     expires_ms = excluded.expires_ms
                 WHERE {t}.token IS NULL OR {t}.expires_ms <= excluded.created_ms
                 RETURNING fence"
            ),
            // Returns (remaining ms, owner, now).
            remaining: format!(
                "SELECT expires_ms - {LITE_MS}, token, {LITE_MS} FROM {t}
                 WHERE region = ?1 AND lock_key = ?2"
            ),
            release: format!(
                "UPDATE {t} SET token = NULL, owner = NULL
                 WHERE region = ?1 AND lock_key = ?2 AND token = ?3 AND expires_ms > {LITE_MS}"
            ),
            extend: format!(
                "UPDATE {t} SET expires_ms = {LITE_MS} + ?4
                 WHERE region = ?1 AND lock_key = ?2 AND token = ?3 AND expires_ms > {LITE_MS}"
            ),
            // Returns (token, fence, remaining ms, shares, permits, longest share ms, writers,
            // share owners, owner).
            inspect: format!(
                "SELECT l.token, l.fence, l.expires_ms - {LITE_MS}, {}, l.owner
                 FROM {t} l
                 WHERE l.region = ?1 AND l.lock_key = ?2 AND l.token IS NOT NULL
                   AND l.expires_ms > {LITE_MS}",
                summary(&live)
            ),
            // ?1 region. Returns (key, then as inspect) per held key.
            list: format!(
                "SELECT l.lock_key, l.token, l.fence, l.expires_ms - {LITE_MS}, {}, l.owner
                 FROM {t} l
                 WHERE l.region = ?1 AND l.token IS NOT NULL AND l.expires_ms > {LITE_MS}",
                summary(&live)
            ),
            touch_row: format!(
                "INSERT INTO {t} (region, lock_key, token, fence, created_ms, expires_ms)
                 VALUES (?1, ?2, NULL, 0, 0, 0) ON CONFLICT (region, lock_key) DO NOTHING"
            ),
            // Returns (owner, fence, expires ms, now).
            row: format!(
                "SELECT token, fence, expires_ms, {LITE_MS} FROM {t}
                 WHERE region = ?1 AND lock_key = ?2"
            ),
            // ?3 now. Returns (token, kind, permits, expires ms).
            live_holds: format!(
                "SELECT token, kind, permits, expires_ms FROM {h}
                 WHERE region = ?1 AND lock_key = ?2 AND expires_ms > ?3"
            ),
            // ?3 token, ?4 kind, ?5 permits, ?6 expires ms, ?7 fence, ?8 owner.
            put_hold: format!(
                "INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence, owner)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (region, lock_key, token) DO UPDATE SET
                     kind = excluded.kind, permits = excluded.permits, owner = excluded.owner,
                     expires_ms = excluded.expires_ms, fence = excluded.fence"
            ),
            // ?3 mark, ?4 fence, ?5 now, ?6 expires ms.
            mark_row: format!(
                "UPDATE {t} SET token = ?3, fence = ?4, created_ms = ?5, expires_ms = ?6
                 WHERE region = ?1 AND lock_key = ?2"
            ),
            // ?3 token. Removes the token's hold and whatever expired; one row per hold
            // removed: whether it was the token's live share.
            drop_hold: format!(
                "DELETE FROM {h} WHERE region = ?1 AND lock_key = ?2
                   AND (token = ?3 OR expires_ms <= {LITE_MS})
                 RETURNING token = ?3 AND {shares} AND expires_ms > {LITE_MS}"
            ),
            // After a share went: the row keeps the longest lease of the shares left, or is
            // free.
            settle_row: format!(
                "UPDATE {t} SET
                     token = CASE WHEN (SELECT MAX(x.expires_ms) FROM {h} x {left}) IS NULL
                                  THEN NULL ELSE token END,
                     expires_ms = COALESCE((SELECT MAX(x.expires_ms) FROM {h} x {left}), expires_ms)
                 WHERE region = ?1 AND lock_key = ?2 AND token IN {marks}",
                left = format!(
                    "WHERE x.region = ?1 AND x.lock_key = ?2 AND x.{shares}
                       AND x.expires_ms > {LITE_MS}"
                )
            ),
            // ?3 token, ?4 lease ms, ?5 now; only while shares hold the row.
            extend_hold: format!(
                "UPDATE {h} SET expires_ms = ?5 + ?4
                 WHERE region = ?1 AND lock_key = ?2 AND token = ?3 AND {shares}
                   AND expires_ms > ?5
                   AND EXISTS (SELECT 1 FROM {t} m WHERE m.region = ?1 AND m.lock_key = ?2
                                 AND m.token IN {marks})"
            ),
            // ?3 expires ms.
            raise_row: format!(
                "UPDATE {t} SET expires_ms = MAX(expires_ms, ?3)
                 WHERE region = ?1 AND lock_key = ?2 AND token IN {marks}"
            ),
            // ?3 token, ?4 expires ms.
            writer_place: format!(
                "INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence)
                 VALUES (?1, ?2, ?3, '{WRITER}', 0, ?4, 0)
                 ON CONFLICT (region, lock_key, token) DO UPDATE SET
                     expires_ms = excluded.expires_ms"
            ),
            // ?3 token.
            leave: format!(
                "DELETE FROM {h} WHERE region = ?1 AND lock_key = ?2 AND token = ?3
                   AND kind = '{WRITER}'"
            ),
            // ?3 now. Every share, and whatever expired.
            drop_shares: format!(
                "DELETE FROM {h} WHERE region = ?1 AND lock_key = ?2
                   AND ({shares} OR expires_ms <= ?3)"
            ),
            force_delete: format!(
                "UPDATE {t} SET token = NULL, owner = NULL
                 WHERE region = ?1 AND lock_key = ?2 AND token IS NOT NULL
                   AND expires_ms > {LITE_MS}"
            ),
        }
    }
}
