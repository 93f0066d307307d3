//! Every SQL statement of the PostgreSQL, MySQL/MariaDB and SQLite backends, side by side: the
//! one place where the dialects differ. All implement the same lease table (see the
//! [module docs](super)); the differences are the clock expressions, the upsert syntax, the
//! identifier quoting and the column types of the key (and SQLite, alone on one machine, has no
//! `wanted_ms` column and counts fences from 1).
//!
//! PostgreSQL statements are prepared once per connection and take `$n` parameters. MySQL
//! statements are built per call as text with every value written as a literal that cannot
//! break out of it (hex literals for keys and regions, hex digits for tokens, integers), so
//! that a statement and the `SELECT` reading its outcome travel in one round trip.

// The dialects stay side by side whatever backends a build enables, so a build with only some
// of the SQL features leaves the others' statements unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]

use std::fmt::Write as _;

/// The SQL text of one backend instance.
#[derive(Debug, Clone)]
pub(crate) struct Pg {
    /// Creation of the table (and schema), run under an advisory transaction lock.
    pub(crate) create: Vec<String>,
    /// `SELECT to_regclass(...) IS NOT NULL`.
    pub(crate) exists: String,
    /// The common case first: an `UPDATE` of the key's existing row (same parameters and
    /// result as `acquire`); no row means the key has no row yet, or it is busy and already
    /// marked wanted, and `acquire` decides. `None` in Spring mode, where rows are deleted on
    /// release.
    pub(crate) acquire_existing: Option<String>,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) extend: String,
    pub(crate) extend_many: String,
    pub(crate) inspect: String,
    pub(crate) force_delete: String,
}

// Clocks. `now()` is the start of the statement's transaction: taken before the statement
// waits for a row lock, so a lease it writes ends no later than the holder reckons, and an
// expiry it checks is judged no earlier than it happened.
const PG_US: &str = "(EXTRACT(EPOCH FROM now()) * 1000000)::bigint";
const PG_MS_FLOOR: &str = "floor(EXTRACT(EPOCH FROM now()) * 1000)::bigint";
const PG_MS_CEIL: &str = "ceil(EXTRACT(EPOCH FROM now()) * 1000)::bigint";
const PG_UTC: &str = "(now() AT TIME ZONE 'UTC')";

/// PostgreSQL folds unquoted names to lower case; quoting the folded name gives the same table
/// as an unquoted reference (Spring's `INT_LOCK` is `int_lock`) and survives reserved words.
fn pg_ident(name: &str) -> String {
    format!("\"{}\"", name.to_ascii_lowercase())
}

fn pg_table(schema: Option<&str>, table: &str) -> String {
    match schema {
        Some(s) => format!("{}.{}", pg_ident(s), pg_ident(table)),
        None => pg_ident(table),
    }
}

impl Pg {
    /// Native layout. Parameters: see each statement.
    pub(crate) fn native(schema: Option<&str>, table: &str) -> Self {
        let t = pg_table(schema, table);
        let free = format!(
            "(l.token IS NULL OR l.token = excluded.token OR l.expires_ms <= {PG_MS_FLOOR})"
        );
        let mut create = Vec::new();
        if let Some(s) = schema {
            create.push(format!("CREATE SCHEMA IF NOT EXISTS {}", pg_ident(s)));
        }
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                region TEXT NOT NULL,
                lock_key TEXT NOT NULL,
                token TEXT NULL,
                fence BIGINT NOT NULL,
                created_ms BIGINT NOT NULL,
                expires_ms BIGINT NOT NULL,
                wanted_ms BIGINT NULL,
                PRIMARY KEY (region, lock_key)
            )"
        ));
        let free_old =
            format!("(l.token IS NULL OR l.token = $3 OR l.expires_ms <= {PG_MS_FLOOR})");
        Pg {
            create,
            exists: exists_query(schema, table),
            // $1 region, $2 key, $3 token, $4 lease ms, $5 want window ms. A plain UPDATE costs
            // about a third less than the upsert below when the row exists, which it does after
            // the key's first use. It always writes the row (also when busy), so that "no row"
            // can only mean a missing row... or a busy row whose stamp is fresh, see WHERE.
            acquire_existing: Some(format!(
                "UPDATE {t} AS l SET
                     token = CASE WHEN {free_old} THEN $3 ELSE l.token END,
                     fence = CASE WHEN {free_old} THEN GREATEST(l.fence + 1, {PG_US}) ELSE l.fence END,
                     created_ms = CASE WHEN {free_old} THEN {PG_MS_CEIL} ELSE l.created_ms END,
                     expires_ms = CASE WHEN {free_old} THEN {PG_MS_CEIL} + $4::bigint
                                       ELSE l.expires_ms END,
                     wanted_ms = CASE WHEN {free_old} THEN l.wanted_ms
                                      ELSE {PG_MS_CEIL} + $5::bigint END
                 WHERE region = $1 AND lock_key = $2
                   AND ({free_old} OR l.wanted_ms IS NULL
                        OR l.wanted_ms < {PG_MS_CEIL} + $5::bigint / 2)
                 RETURNING token = $3, fence, expires_ms - {PG_MS_CEIL}"
            )),
            // $1 region, $2 key, $3 token, $4 lease ms, $5 want window ms.
            // Takes a free, expired or own row; on a busy row only (re)stamps `wanted_ms` when
            // less than half of the window is left, else writes nothing and returns no row.
            // Returns (ours, fence, remaining ms of the holder).
            acquire: format!(
                "INSERT INTO {t} AS l (region, lock_key, token, fence, created_ms, expires_ms, wanted_ms)
                 VALUES ($1, $2, $3, {PG_US}, {PG_MS_CEIL}, {PG_MS_CEIL} + $4::bigint, NULL)
                 ON CONFLICT (region, lock_key) DO UPDATE SET
                     token = CASE WHEN {free} THEN excluded.token ELSE l.token END,
                     fence = CASE WHEN {free} THEN GREATEST(l.fence + 1, excluded.fence) ELSE l.fence END,
                     created_ms = CASE WHEN {free} THEN excluded.created_ms ELSE l.created_ms END,
                     expires_ms = CASE WHEN {free} THEN excluded.expires_ms ELSE l.expires_ms END,
                     wanted_ms = CASE WHEN {free} THEN l.wanted_ms
                                      ELSE excluded.created_ms + $5::bigint END
                 WHERE {free} OR l.wanted_ms IS NULL
                    OR l.wanted_ms < excluded.created_ms + $5::bigint / 2
                 RETURNING token = $3, fence, expires_ms - {PG_MS_CEIL}"
            ),
            // $1 region, $2 key, $3 token, $4 channel, $5 payload. Returns (contended) when
            // released; notifies listeners in the same statement when a waiter stamped the row.
            release: format!(
                "UPDATE {t} SET token = NULL
                 WHERE region = $1 AND lock_key = $2 AND token = $3 AND expires_ms > {PG_MS_FLOOR}
                 RETURNING COALESCE(wanted_ms > {PG_MS_FLOOR}, false),
                     CASE WHEN wanted_ms > {PG_MS_FLOOR} THEN pg_notify($4, $5)::text END"
            ),
            // $1 region, $2 key, $3 token, $4 lease ms.
            extend: format!(
                "UPDATE {t} SET expires_ms = {PG_MS_CEIL} + $4::bigint
                 WHERE region = $1 AND lock_key = $2 AND token = $3 AND expires_ms > {PG_MS_FLOOR}
                 RETURNING 1"
            ),
            // $1 regions, $2 keys, $3 tokens, $4 lease ms. Returns the extended entries.
            extend_many: format!(
                "UPDATE {t} AS l SET expires_ms = {PG_MS_CEIL} + b.lease_ms
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
                      AS b(region, lock_key, token, lease_ms)
                 WHERE l.region = b.region AND l.lock_key = b.lock_key AND l.token = b.token
                   AND l.expires_ms > {PG_MS_FLOOR}
                 RETURNING l.region, l.lock_key, l.token"
            ),
            // $1 region, $2 key. Returns (fence, remaining ms) when held.
            inspect: format!(
                "SELECT fence, expires_ms - {PG_MS_CEIL} FROM {t}
                 WHERE region = $1 AND lock_key = $2 AND token IS NOT NULL
                   AND expires_ms > {PG_MS_FLOOR}"
            ),
            // $1 region, $2 key, $3 channel, $4 payload.
            force_delete: format!(
                "UPDATE {t} SET token = NULL
                 WHERE region = $1 AND lock_key = $2 AND token IS NOT NULL
                   AND expires_ms > {PG_MS_FLOOR}
                 RETURNING pg_notify($3, $4)::text"
            ),
        }
    }

    /// Spring's `INT_LOCK` layout; `$1` is always the `LOCK_KEY`, `$2` the `REGION`, `$3` the
    /// `CLIENT_ID`, in the same roles as in [`native`](Self::native) otherwise.
    pub(crate) fn spring(schema: Option<&str>, table: &str) -> Self {
        let t = pg_table(schema, table);
        let fence = "(EXTRACT(EPOCH FROM CREATED_DATE) * 1000000)::bigint";
        let remaining =
            format!("ceil(EXTRACT(EPOCH FROM (EXPIRED_AFTER - {PG_UTC})) * 1000)::bigint");
        let lease = "($4::bigint * INTERVAL '1 millisecond')";
        let mut create = Vec::new();
        if let Some(s) = schema {
            create.push(format!("CREATE SCHEMA IF NOT EXISTS {}", pg_ident(s)));
        }
        // Spring's schema-postgresql.sql, with IF NOT EXISTS.
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                LOCK_KEY CHAR(36) NOT NULL,
                REGION VARCHAR(100) NOT NULL,
                CLIENT_ID CHAR(36),
                CREATED_DATE TIMESTAMP NOT NULL,
                EXPIRED_AFTER TIMESTAMP NOT NULL,
                constraint {} primary key (LOCK_KEY, REGION)
            )",
            pg_ident(&format!("{table}_PK"))
        ));
        Pg {
            create,
            exists: exists_query(schema, table),
            acquire_existing: None,
            // $1 key, $2 region, $3 client id, $4 lease ms, $5 unused (want window).
            acquire: format!(
                "INSERT INTO {t} AS l (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER)
                 VALUES ($1, $2, $3, {PG_UTC}, {PG_UTC} + {lease})
                 ON CONFLICT (LOCK_KEY, REGION) DO UPDATE SET
                     CLIENT_ID = excluded.CLIENT_ID,
                     CREATED_DATE = excluded.CREATED_DATE,
                     EXPIRED_AFTER = excluded.EXPIRED_AFTER
                 WHERE l.CLIENT_ID = excluded.CLIENT_ID OR l.EXPIRED_AFTER < excluded.CREATED_DATE
                 RETURNING CLIENT_ID = $3 AND $5::bigint IS NOT NULL, {fence}, {remaining}"
            ),
            // $1 key, $2 region, $3 client id, $4 channel, $5 payload.
            release: format!(
                "DELETE FROM {t}
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3
                   AND EXPIRED_AFTER >= {PG_UTC}
                 RETURNING false, pg_notify($4, $5)::text"
            ),
            extend: format!(
                "UPDATE {t} SET EXPIRED_AFTER = {PG_UTC} + {lease}
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND CLIENT_ID = $3
                   AND EXPIRED_AFTER >= {PG_UTC}
                 RETURNING 1"
            ),
            // $1 keys, $2 regions, $3 client ids, $4 lease ms.
            extend_many: format!(
                "UPDATE {t} AS l SET EXPIRED_AFTER = {PG_UTC} + b.lease_ms * INTERVAL '1 millisecond'
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
                      AS b(lock_key, region, client_id, lease_ms)
                 WHERE l.LOCK_KEY = b.lock_key::char(36) AND l.REGION = b.region
                   AND l.CLIENT_ID = b.client_id::char(36) AND l.EXPIRED_AFTER >= {PG_UTC}
                 RETURNING l.LOCK_KEY::text, l.REGION::text, l.CLIENT_ID::text"
            ),
            inspect: format!(
                "SELECT {fence}, {remaining} FROM {t}
                 WHERE LOCK_KEY = $1 AND REGION = $2 AND EXPIRED_AFTER >= {PG_UTC}"
            ),
            // $1 key, $2 region, $3 channel, $4 payload.
            force_delete: format!(
                "DELETE FROM {t} WHERE LOCK_KEY = $1 AND REGION = $2
                 RETURNING pg_notify($3, $4)::text"
            ),
        }
    }
}

fn exists_query(schema: Option<&str>, table: &str) -> String {
    // to_regclass takes the name as SQL would parse it: the quoted, folded form.
    let name = pg_table(schema, table).replace('\'', "''");
    format!("SELECT to_regclass('{name}') IS NOT NULL")
}

/// MySQL / MariaDB statements, built per call.
#[derive(Debug, Clone)]
pub(crate) struct My {
    table: String,
    spring: bool,
}

const MY_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
const MY_UTC: &str = "UTC_TIMESTAMP(6)";

fn my_ms_floor() -> String {
    format!("({MY_US} DIV 1000)")
}

fn my_ms_ceil() -> String {
    format!("(({MY_US} + 999) DIV 1000)")
}

/// A byte string as a MySQL hex literal: nothing in it can end the literal.
pub(crate) fn hex_literal(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2 + 3);
    s.push_str("X'");
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s.push('\'');
    s
}

/// A UTF-8 string as a MySQL utf8mb4 value, through a hex literal.
fn text_literal(text: &str) -> String {
    format!("CONVERT({} USING utf8mb4)", hex_literal(text.as_bytes()))
}

/// One lock as the MySQL statements address it.
#[derive(Debug, Clone)]
pub(crate) struct MyLock<'a> {
    /// Native: the region; Spring: `REGION`.
    pub(crate) region: &'a str,
    /// Native: the key; Spring: the `LOCK_KEY` UUID.
    pub(crate) key: &'a str,
    /// Native: 32 hex digits; Spring: the 36-character UUID. Both are only `[0-9a-f-]`.
    pub(crate) token: &'a str,
}

impl MyLock<'_> {
    fn checked_token(&self) -> &str {
        assert!(
            self.token
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b'-'),
            "tokens are hex digits"
        );
        self.token
    }
}

/// A statement with `?` placeholders, and the name of the value each one takes, in order
/// (`region`, `key`, `tok`, `lease`, `want`, `half`). Prepared once per connection, so the
/// server parses the long lease-table statements once instead of on every call.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub(crate) sql: String,
    pub(crate) names: Vec<&'static str>,
}

impl Prepared {
    const NAMES: [&'static str; 6] = ["region", "key", "tok", "lease", "want", "half"];

    /// Turns `:name` markers into `?` and records the names.
    fn new(template: &str) -> Prepared {
        let mut sql = String::with_capacity(template.len());
        let mut names = Vec::new();
        let mut rest = template;
        while let Some(i) = rest.find(':') {
            sql.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let name = Self::NAMES.into_iter().find(|n| {
                after.starts_with(n)
                    && !after[n.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            });
            match name {
                Some(n) => {
                    sql.push('?');
                    names.push(n);
                    rest = &after[n.len()..];
                }
                None => {
                    sql.push(':');
                    rest = after;
                }
            }
        }
        sql.push_str(rest);
        Prepared { sql, names }
    }
}

/// What a single-statement acquisition of [`My::acquire_existing`] reported through
/// `LAST_INSERT_ID(expr)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MyOutcome {
    /// Taken, with the new fence; `wanted`: a waiter said lately that it waits.
    Acquired { fence: i64, wanted: bool },
    /// Held by another owner for `remaining_ms` more.
    Busy { remaining_ms: i64 },
}

impl MyOutcome {
    /// Busy outcomes are at or above this; fences (µs since 1970, doubled) stay far below.
    pub(crate) const BUSY: u64 = 1 << 62;

    pub(crate) fn decode(v: u64) -> Option<MyOutcome> {
        if v == 0 {
            None
        } else if v >= Self::BUSY {
            Some(MyOutcome::Busy {
                remaining_ms: i64::try_from(v - Self::BUSY).ok()?,
            })
        } else {
            Some(MyOutcome::Acquired {
                fence: i64::try_from(v / 2).ok()?,
                wanted: v % 2 == 1,
            })
        }
    }
}

impl My {
    pub(crate) fn new(schema: Option<&str>, table: &str, spring: bool) -> Self {
        let table = match schema {
            Some(s) => format!("`{s}`.`{table}`"),
            None => format!("`{table}`"),
        };
        My { table, spring }
    }

    /// `SELECT COUNT(*)` of the table in `information_schema`: 1 when it exists.
    pub(crate) fn exists(&self, schema: Option<&str>, table: &str) -> String {
        let schema = match schema {
            Some(s) => format!("'{s}'"),
            None => "DATABASE()".to_owned(),
        };
        format!(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = {schema} AND table_name = '{table}'"
        )
    }

    pub(crate) fn create(&self) -> String {
        let t = &self.table;
        if self.spring {
            // Spring's schema-mysql.sql, with IF NOT EXISTS.
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    LOCK_KEY CHAR(36) NOT NULL,
                    REGION VARCHAR(100) NOT NULL,
                    CLIENT_ID CHAR(36),
                    CREATED_DATE DATETIME(6) NOT NULL,
                    EXPIRED_AFTER DATETIME(6) NOT NULL,
                    constraint INT_LOCK_PK primary key (LOCK_KEY, REGION)
                ) ENGINE=InnoDB"
            )
        } else {
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    region VARBINARY(256) NOT NULL,
                    lock_key VARBINARY(1024) NOT NULL,
                    token CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
                    fence BIGINT NOT NULL,
                    created_ms BIGINT NOT NULL,
                    expires_ms BIGINT NOT NULL,
                    wanted_ms BIGINT NULL,
                    PRIMARY KEY (region, lock_key)
                ) ENGINE=InnoDB"
            )
        }
    }

    fn where_lock(&self, l: &MyLock<'_>) -> String {
        if self.spring {
            format!(
                "LOCK_KEY = '{}' AND REGION = {}",
                l.key.replace('\'', ""),
                text_literal(l.region)
            )
        } else {
            format!(
                "region = {} AND lock_key = {}",
                hex_literal(l.region.as_bytes()),
                hex_literal(l.key.as_bytes())
            )
        }
    }

    /// The common case first (native layout only): one `UPDATE` of the existing row, whose
    /// outcome comes back in the OK packet, without a result set: the matched rows (0: the
    /// key has no row yet, [`acquire`](Self::acquire) inserts it) and the value given to
    /// `LAST_INSERT_ID(expr)`, which [`MyOutcome::decode`] reads. The `WHERE` clause computes
    /// it from the row as it was, with the same expressions as the assignments (the server's
    /// time functions are constant within a statement).
    pub(crate) fn acquire_existing(
        &self,
        l: &MyLock<'_>,
        lease_ms: i64,
        want_ms: i64,
    ) -> Option<String> {
        if self.spring {
            return None;
        }
        let tok = format!("'{}'", l.checked_token());
        let w = self.where_lock(l);
        Some(self.acquire_existing_with(
            &tok,
            &w,
            &lease_ms.to_string(),
            &want_ms.to_string(),
            &(want_ms / 2).to_string(),
        ))
    }

    /// [`acquire_existing`](Self::acquire_existing) as a prepared statement (native layout).
    pub(crate) fn acquire_existing_prepared(&self) -> Prepared {
        Prepared::new(&self.acquire_existing_with(
            ":tok",
            "region = :region AND lock_key = :key",
            ":lease",
            ":want",
            ":half",
        ))
    }

    fn acquire_existing_with(
        &self,
        tok: &str,
        w: &str,
        lease_ms: &str,
        want_ms: &str,
        half: &str,
    ) -> String {
        let t = &self.table;
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        // Same order of assignments as in `acquire`, for the same reason.
        let free = format!("(token IS NULL OR token = {tok} OR expires_ms <= {floor})");
        let fence = format!("GREATEST(fence + 1, {MY_US})");
        format!(
            "UPDATE {t} SET
                 fence = IF({free}, {fence}, fence),
                 wanted_ms = IF({free} OR wanted_ms >= {ceil} + {half}, wanted_ms,
                                {ceil} + {want_ms}),
                 created_ms = IF({free}, {ceil}, created_ms),
                 token = IF({free}, {tok}, token),
                 expires_ms = IF({free}, {ceil} + {lease_ms}, expires_ms)
             WHERE {w} AND LAST_INSERT_ID(IF({free},
                 {fence} * 2 + IFNULL(wanted_ms > {floor}, 0),
                 {BUSY} + GREATEST(expires_ms - {ceil}, 0))) > 0",
            BUSY = MyOutcome::BUSY,
        )
    }

    /// Two statements; the second returns one row (ours: 0/1, fence, remaining ms) or none.
    pub(crate) fn acquire(&self, l: &MyLock<'_>, lease_ms: i64, want_ms: i64) -> String {
        let t = &self.table;
        let tok = l.checked_token();
        let w = self.where_lock(l);
        if self.spring {
            let key = l.key.replace('\'', "");
            let region = text_literal(l.region);
            let fence = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', CREATED_DATE)";
            let free = "(CLIENT_ID = VALUES(CLIENT_ID) OR EXPIRED_AFTER < VALUES(CREATED_DATE))";
            return format!(
                "INSERT INTO {t} (LOCK_KEY, REGION, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER)
                 VALUES ('{key}', {region}, '{tok}', {MY_UTC},
                         {MY_UTC} + INTERVAL {lease_us} MICROSECOND)
                 ON DUPLICATE KEY UPDATE
                     CREATED_DATE = IF({free}, VALUES(CREATED_DATE), CREATED_DATE),
                     CLIENT_ID = IF({free}, VALUES(CLIENT_ID), CLIENT_ID),
                     EXPIRED_AFTER = IF({free}, VALUES(EXPIRED_AFTER), EXPIRED_AFTER);
                 SELECT CLIENT_ID = '{tok}', {fence},
                        CEIL(TIMESTAMPDIFF(MICROSECOND, {MY_UTC}, EXPIRED_AFTER) / 1000)
                 FROM {t} WHERE {w}",
                lease_us = lease_ms * 1000
            );
        }
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        let region = hex_literal(l.region.as_bytes());
        let key = hex_literal(l.key.as_bytes());
        // MySQL (and MariaDB by default) apply the assignments left to right, each seeing the
        // columns assigned before it; MariaDB's SIMULTANEOUS_ASSIGNMENT mode shows them all the
        // original row. `free` reads only `token` and `expires_ms`, assigned last in this order,
        // so every assignment sees the same answer under both rules (after `token` is taken,
        // `token = VALUES(token)` keeps `free` true for `expires_ms`).
        let free = format!("(token IS NULL OR token = VALUES(token) OR expires_ms <= {floor})");
        format!(
            "INSERT INTO {t} (region, lock_key, token, fence, created_ms, expires_ms, wanted_ms)
             VALUES ({region}, {key}, '{tok}', {MY_US}, {ceil}, {ceil} + {lease_ms}, NULL)
             ON DUPLICATE KEY UPDATE
                 fence = IF({free}, GREATEST(fence + 1, VALUES(fence)), fence),
                 wanted_ms = IF({free} OR wanted_ms >= VALUES(created_ms) + {half}, wanted_ms,
                                VALUES(created_ms) + {want_ms}),
                 created_ms = IF({free}, VALUES(created_ms), created_ms),
                 token = IF({free}, VALUES(token), token),
                 expires_ms = IF({free}, VALUES(expires_ms), expires_ms);
             SELECT token = '{tok}', fence, expires_ms - {ceil} FROM {t} WHERE {w}",
            half = want_ms / 2
        )
    }

    /// Spring layout: two statements, the second returns (released 0/1, 0). Native layout: one
    /// `UPDATE`; one matched row means released, and `LAST_INSERT_ID` is 2 when a waiter said
    /// it waits (contended), else 1.
    pub(crate) fn release(&self, l: &MyLock<'_>) -> String {
        let t = &self.table;
        let tok = l.checked_token();
        let w = self.where_lock(l);
        if self.spring {
            return format!(
                "DELETE FROM {t} WHERE {w} AND CLIENT_ID = '{tok}' AND EXPIRED_AFTER >= {MY_UTC};
                 SELECT ROW_COUNT(), 0"
            );
        }
        Self::release_with(t, &w, &format!("'{tok}'"))
    }

    /// [`release`](Self::release) as a prepared statement (native layout).
    pub(crate) fn release_prepared(&self) -> Prepared {
        Prepared::new(&Self::release_with(
            &self.table,
            "region = :region AND lock_key = :key",
            ":tok",
        ))
    }

    fn release_with(t: &str, w: &str, tok: &str) -> String {
        let floor = my_ms_floor();
        format!(
            "UPDATE {t} SET token = NULL
             WHERE {w} AND token = {tok} AND expires_ms > {floor}
               AND LAST_INSERT_ID(1 + IFNULL(wanted_ms > {floor}, 0)) > 0"
        )
    }

    /// One statement; affected rows (with CLIENT_FOUND_ROWS) tell whether it was extended.
    pub(crate) fn extend(&self, l: &MyLock<'_>, lease_ms: i64) -> String {
        let t = &self.table;
        let tok = l.checked_token();
        let w = self.where_lock(l);
        if self.spring {
            return format!(
                "UPDATE {t} SET EXPIRED_AFTER = {MY_UTC} + INTERVAL {} MICROSECOND
                 WHERE {w} AND CLIENT_ID = '{tok}' AND EXPIRED_AFTER >= {MY_UTC}",
                lease_ms * 1000
            );
        }
        format!(
            "UPDATE {t} SET expires_ms = {} + {lease_ms}
             WHERE {w} AND token = '{tok}' AND expires_ms > {}",
            my_ms_ceil(),
            my_ms_floor()
        )
    }

    /// Two statements: one `UPDATE` joined with the batch, then a `SELECT` of the entries that
    /// now hold an unexpired lease, as (index) rows.
    pub(crate) fn extend_many(&self, batch: &[(MyLock<'_>, i64)]) -> String {
        let t = &self.table;
        let mut derived = String::new();
        for (i, (l, lease_ms)) in batch.iter().enumerate() {
            if i > 0 {
                derived.push_str(" UNION ALL ");
            }
            let tok = l.checked_token();
            if self.spring {
                let _ = write!(
                    derived,
                    "SELECT {i} AS i, '{}' AS k, {} AS r, '{tok}' AS c, {lease_ms} AS l",
                    l.key.replace('\'', ""),
                    text_literal(l.region)
                );
            } else {
                let _ = write!(
                    derived,
                    "SELECT {i} AS i, {} AS r, {} AS k, '{tok}' AS c, {lease_ms} AS l",
                    hex_literal(l.region.as_bytes()),
                    hex_literal(l.key.as_bytes())
                );
            }
        }
        if self.spring {
            format!(
                "UPDATE {t} JOIN ({derived}) b
                     ON {t}.LOCK_KEY = b.k AND {t}.REGION = b.r AND {t}.CLIENT_ID = b.c
                 SET {t}.EXPIRED_AFTER = {MY_UTC} + INTERVAL b.l * 1000 MICROSECOND
                 WHERE {t}.EXPIRED_AFTER >= {MY_UTC};
                 SELECT b.i FROM {t} JOIN ({derived}) b
                     ON {t}.LOCK_KEY = b.k AND {t}.REGION = b.r AND {t}.CLIENT_ID = b.c
                 WHERE {t}.EXPIRED_AFTER >= {MY_UTC}"
            )
        } else {
            let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
            format!(
                "UPDATE {t} JOIN ({derived}) b
                     ON {t}.region = b.r AND {t}.lock_key = b.k AND {t}.token = b.c
                 SET {t}.expires_ms = {ceil} + b.l
                 WHERE {t}.expires_ms > {floor};
                 SELECT b.i FROM {t} JOIN ({derived}) b
                     ON {t}.region = b.r AND {t}.lock_key = b.k AND {t}.token = b.c
                 WHERE {t}.expires_ms > {floor}"
            )
        }
    }

    /// One statement returning (fence, remaining ms) when held.
    pub(crate) fn inspect(&self, l: &MyLock<'_>) -> String {
        let t = &self.table;
        let w = self.where_lock(l);
        if self.spring {
            return format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', CREATED_DATE),
                        CEIL(TIMESTAMPDIFF(MICROSECOND, {MY_UTC}, EXPIRED_AFTER) / 1000)
                 FROM {t} WHERE {w} AND EXPIRED_AFTER >= {MY_UTC}"
            );
        }
        format!(
            "SELECT fence, expires_ms - {} FROM {t}
             WHERE {w} AND token IS NOT NULL AND expires_ms > {}",
            my_ms_ceil(),
            my_ms_floor()
        )
    }

    /// A waiter's look at a lock's doorbell (see `doorbell.rs`), one row: who held the
    /// doorbell when the statement began (connection id, 0 for nobody), whether the lock is
    /// free now (1/0), whether the doorbell was taken and given back (1; 0 when the lock was
    /// free, so nobody waited, or after `wait_s` seconds), and the lock's version at the end
    /// (native layout: the fence; Spring: the creation time; NULL without a row), which tells
    /// a later look whether somebody took the lock meanwhile.
    /// `OWN_RINGERS` in the statement is replaced by the connection ids of the caller's own
    /// doorbell connections (a doorbell held by one of them is not waited for).
    pub(crate) fn doorbell_wait(&self, l: &MyLock<'_>, doorbell: &str, wait_s: f64) -> String {
        let t = &self.table;
        let w = self.where_lock(l);
        let live = if self.spring {
            format!("EXPIRED_AFTER >= {MY_UTC}")
        } else {
            format!("token IS NOT NULL AND expires_ms > {}", my_ms_floor())
        };
        let free = format!("NOT EXISTS (SELECT 1 FROM {t} WHERE {w} AND {live})");
        let version = if self.spring {
            "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', CREATED_DATE)"
        } else {
            "fence"
        };
        format!(
            "SELECT IFNULL(IS_USED_LOCK('{doorbell}'), 0), {free},
                    IF({free} OR IFNULL(IS_USED_LOCK('{doorbell}'), 0) IN (OWN_RINGERS), 0,
                       IF(GET_LOCK('{doorbell}', {wait_s}) = 1, RELEASE_LOCK('{doorbell}'), 0)),
                    (SELECT {version} FROM {t} WHERE {w})"
        )
    }

    /// One statement; affected rows tell whether a live hold existed.
    pub(crate) fn force_delete(&self, l: &MyLock<'_>) -> String {
        let t = &self.table;
        let w = self.where_lock(l);
        if self.spring {
            return format!("DELETE FROM {t} WHERE {w} AND EXPIRED_AFTER >= {MY_UTC}");
        }
        format!(
            "UPDATE {t} SET token = NULL WHERE {w} AND token IS NOT NULL AND expires_ms > {}",
            my_ms_floor()
        )
    }
}

// ----------------------------------------------------------------------------------------
// SQLite

/// The database's clock in Unix milliseconds. `julianday` works on every SQLite version (unlike
/// `unixepoch('subsec')`); SQLite keeps `'now'` in whole milliseconds, so `ROUND` undoes the
/// floating-point detour exactly. Within one statement every use sees the same instant.
const LITE_MS: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_and_folded() {
        assert_eq!(
            pg_table(Some("Infra"), "INT_LOCK"),
            "\"infra\".\"int_lock\""
        );
        let my = My::new(Some("app"), "INT_LOCK", true);
        assert!(my.create().contains("`app`.`INT_LOCK`"));
    }

    #[test]
    fn values_cannot_escape_their_literals() {
        assert_eq!(hex_literal(b"'; --"), "X'273b202d2d'");
        let my = My::new(None, "t", false);
        let sql = my.acquire(
            &MyLock {
                region: "lock",
                key: "'; DROP TABLE t; --",
                token: "00ff",
            },
            1000,
            2000,
        );
        assert!(!sql.contains("DROP"), "{sql}");
    }

    #[test]
    fn prepared_statements_take_their_values_in_order() {
        let my = My::new(None, "t", false);
        let p = my.release_prepared();
        assert_eq!(p.names, ["region", "key", "tok"]);
        assert_eq!(p.sql.matches('?').count(), 3);
        // Time literals keep their colons.
        assert!(p.sql.contains("'1970-01-01 00:00:00'"), "{}", p.sql);
        let a = my.acquire_existing_prepared();
        assert_eq!(a.sql.matches('?').count(), a.names.len());
        assert!(a.names.contains(&"lease") && a.names.contains(&"half"));
    }

    #[test]
    #[should_panic(expected = "hex digits")]
    fn tokens_must_be_hex() {
        let my = My::new(None, "t", false);
        my.release(&MyLock {
            region: "r",
            key: "k",
            token: "x'",
        });
    }
}
