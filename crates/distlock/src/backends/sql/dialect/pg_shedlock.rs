//! PostgreSQL statements of ShedLock's table (see `sql::shedlock`): ShedLock's own statements
//! with the database's time (`usingDbTime()`), in the parameter order and result shapes of
//! the Spring layout's, so that the backend runs them the same way.

use super::pg::{exists_query_of, schema_first};
use super::pg_text::pg_table;
use super::pg_wait::PgWaits;
use super::Pg;

/// ShedLock's `now` with `usingDbTime()`.
const NOW: &str = "timezone('utc', CURRENT_TIMESTAMP)";

/// `now` truncated to the column's milliseconds: a released row is free at once (rounding
/// could put it half a millisecond ahead).
fn now_ms() -> String {
    format!("date_trunc('milliseconds', {NOW})")
}

/// `now + lease` rounded up to the millisecond: the lease never ends before its holder
/// reckons.
fn until(lease_ms: &str) -> String {
    format!(
        "date_trunc('milliseconds', {NOW} + ({lease_ms} * INTERVAL '1 millisecond') \
         + INTERVAL '999 microseconds')"
    )
}

/// distlock's hold with token `token` (`locked_by` ends in `" #<token>"`).
fn ours(col: &str, token: &str) -> String {
    format!("right({col}, 34) = ' #' || {token}")
}

impl Pg {
    /// ShedLock's table. `$1` is the `name`, `$2` the namespace (unused but in `list`), `$3` the
    /// token's hex, in the same roles as in [`spring`](Self::spring) otherwise; the
    /// acquisition's `$6` is the whole `locked_by`.
    pub(crate) fn shedlock(schema: Option<&str>, table: &str) -> Self {
        let t = pg_table(schema, table);
        let fence = "(EXTRACT(EPOCH FROM l.locked_at) * 1000000)::bigint";
        let remaining = format!("ceil(EXTRACT(EPOCH FROM (l.lock_until - {NOW})) * 1000)::bigint");
        let released = format!("GREATEST(locked_at, {})", now_ms());
        let mut create = schema_first(schema);
        // ShedLock's documented table.
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                name VARCHAR(64) NOT NULL,
                lock_until TIMESTAMP(3) NOT NULL,
                locked_at TIMESTAMP(3) NOT NULL,
                locked_by VARCHAR(255) NOT NULL,
                PRIMARY KEY (name)
            )"
        ));
        // `release` as the wait table's hand-over takes it (see `pg_wait`).
        let rel = format!(
            "rel AS (
                 UPDATE {t} SET lock_until = {released}
                 WHERE name = $1 AND $2::text IS NOT NULL AND {mine} AND lock_until > {NOW}
                 RETURNING false AS contended, true AS bell
             )",
            mine = ours("locked_by", "$3::text"),
        );
        Pg {
            create,
            exists: exists_query_of(schema, table),
            acquire_existing: None,
            // $1 name, $2 unused, $3 token, $4 lease ms, $5 unused (want window), $6 locked_by.
            // ShedLock's insert (`ON CONFLICT … WHERE lock_until <= now`), which also takes
            // the row back for the same token (a repeated attempt). Returns (ours, fence,
            // remaining ms) when taken, nothing when busy.
            acquire: format!(
                "INSERT INTO {t} AS l (name, lock_until, locked_at, locked_by)
                 VALUES ($1, {until}, {now_ms}, $6::text)
                 ON CONFLICT (name) DO UPDATE SET
                     lock_until = excluded.lock_until,
                     locked_at = excluded.locked_at,
                     locked_by = excluded.locked_by
                 WHERE l.lock_until <= {NOW} OR {mine}
                 RETURNING $2::text IS NOT NULL AND $5::bigint IS NOT NULL, {fence}, {remaining}",
                until = until("$4::bigint"),
                now_ms = now_ms(),
                mine = ours("l.locked_by", "$3::text"),
            ),
            // $1 name, $2 unused, $3 token, $4 channel, $5 payload. ShedLock's unlock with no
            // lock-at-least: `lock_until` back to now; the row stays.
            release: format!(
                "UPDATE {t} SET lock_until = {released}
                 WHERE name = $1 AND $2::text IS NOT NULL AND {mine} AND lock_until > {NOW}
                 RETURNING false, pg_notify($4, $5)::text",
                mine = ours("locked_by", "$3::text"),
            ),
            // $1 name, $2 unused, $3 token, $4 lease ms. ShedLock's extend.
            extend: format!(
                "UPDATE {t} SET lock_until = {until}
                 WHERE name = $1 AND $2::text IS NOT NULL AND {mine} AND lock_until > {NOW}
                 RETURNING 1",
                until = until("$4::bigint"),
                mine = ours("locked_by", "$3::text"),
            ),
            // $1 names, $2 unused regions, $3 tokens, $4 lease ms.
            extend_many: format!(
                "UPDATE {t} AS l SET lock_until = {until}
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
                      AS b(name, region, token, lease_ms)
                 WHERE l.name = b.name AND {mine} AND l.lock_until > {NOW}
                 RETURNING l.name::text, b.region, b.token",
                until = until("b.lease_ms"),
                mine = ours("l.locked_by", "b.token"),
            ),
            // $1 name, $2 unused. Returns (fence, remaining ms, NULL, locked_by) when held.
            inspect: format!(
                "SELECT {fence}, {remaining}, NULL::text, l.locked_by::text FROM {t} l
                 WHERE l.name = $1 AND $2::text IS NOT NULL AND l.lock_until > {NOW}"
            ),
            // $1 the namespace (`sql::shedlock::namespace`): its held rows, every held row for
            // the bare one. Returns (key, name, then as inspect).
            list: format!(
                "SELECT CASE WHEN $1::text = '' THEN l.name::text
                             ELSE substr(l.name, length($1::text) + 2) END,
                        l.name::text, {fence}, {remaining}, NULL::text, l.locked_by::text
                 FROM {t} l
                 WHERE ($1::text = '' OR left(l.name, length($1::text) + 1) = $1::text || ':')
                   AND l.lock_until > {NOW}"
            ),
            kinds: None,
            undescribed: None,
            name_key: None,
            // $1 name, $2 unused, $3 channel, $4 payload: released whoever holds it.
            force_delete: format!(
                "UPDATE {t} SET lock_until = {released}
                 WHERE name = $1 AND $2::text IS NOT NULL AND lock_until > {NOW}
                 RETURNING pg_notify($3, $4)::text"
            ),
            waits: PgWaits::default(),
        }
        .with_waits(
            schema,
            table,
            (&rel, None),
            format!(
                "SELECT {mine}, {remaining}, false FROM {t} l
                 WHERE l.name = $1 AND $2::text IS NOT NULL AND l.lock_until > {NOW}",
                mine = ours("l.locked_by", "$3::text"),
            ),
        )
    }
}
