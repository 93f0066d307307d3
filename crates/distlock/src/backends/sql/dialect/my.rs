//! MySQL / MariaDB statements: built per call as text, every value a literal that cannot break
//! out of it, so that a statement and the `SELECT` reading its outcome travel in one round trip.

use std::fmt::Write as _;

use crate::backends::sql::kinds::{
    holds_table, names_table, Share, LONE_READER, PERMIT, READ, READ_MARK, SEM_MARK, WRITER,
    WRITER_PLACE_MS,
};

/// MySQL / MariaDB statements, built per call.
#[derive(Debug, Clone)]
pub(crate) struct My {
    table: String,
    /// Native: the holds table; Spring: the key names (see `sql::kinds`).
    side: String,
    /// The side table's unquoted name, for `exists`.
    side_name: String,
    spring: bool,
}

pub(super) const MY_US: &str =
    "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
pub(super) const MY_UTC: &str = "UTC_TIMESTAMP(6)";

pub(super) fn my_ms_floor() -> String {
    format!("({MY_US} DIV 1000)")
}

pub(super) fn my_ms_ceil() -> String {
    format!("(({MY_US} + 999) DIV 1000)")
}

/// Whether the `token` column `col` says that readers hold the key (a lone one or several).
fn readers_hold(col: &str) -> String {
    format!("({col} = '{READ_MARK}' OR {col} LIKE '{LONE_READER}%')")
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
pub(super) fn text_literal(text: &str) -> String {
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
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':'),
            "tokens are hex digits, UUIDs or readers' ids"
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
    /// Held by another owner for `remaining_ms` more; `read_shared`: by readers.
    Busy {
        remaining_ms: i64,
        read_shared: bool,
    },
}

/// What [`My::acquire_share`] reported through `LAST_INSERT_ID(expr)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MyShareOutcome {
    /// Taken, with the new fence.
    Acquired { fence: i64 },
    /// The semaphore's holders use this many permits.
    Disagree { permits: i64 },
    /// Kept out; the row's remaining lease.
    Busy { remaining_ms: i64 },
}

impl MyShareOutcome {
    /// Disagreements are at or above this, below [`MyOutcome::BUSY`].
    pub(crate) const DISAGREE: u64 = 1 << 61;

    pub(crate) fn decode(v: u64) -> Option<MyShareOutcome> {
        let i = |x: u64| i64::try_from(x).ok();
        Some(if v >= MyOutcome::BUSY {
            MyShareOutcome::Busy {
                remaining_ms: i(v - MyOutcome::BUSY)?,
            }
        } else if v >= Self::DISAGREE {
            MyShareOutcome::Disagree {
                permits: i(v - Self::DISAGREE)?,
            }
        } else {
            MyShareOutcome::Acquired { fence: i(v / 2)? }
        })
    }
}

impl MyOutcome {
    /// Busy outcomes are at or above this; fences (µs since 1970, doubled) stay far below.
    pub(crate) const BUSY: u64 = 1 << 62;
    /// Added to a busy outcome when readers hold the lock (remaining leases stay below 2⁴¹ ms).
    pub(crate) const READ_SHARED: u64 = 1 << 60;

    pub(crate) fn decode(v: u64) -> Option<MyOutcome> {
        if v == 0 {
            None
        } else if v >= Self::BUSY {
            let rest = v - Self::BUSY;
            Some(MyOutcome::Busy {
                remaining_ms: i64::try_from(rest % Self::READ_SHARED).ok()?,
                read_shared: rest >= Self::READ_SHARED,
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
        let quote = |table: &str| match schema {
            Some(s) => format!("`{s}`.`{table}`"),
            None => format!("`{table}`"),
        };
        let side_name = if spring {
            names_table(table)
        } else {
            holds_table(table)
        };
        My {
            table: quote(table),
            side: quote(&side_name),
            side_name,
            spring,
        }
    }

    /// One row: whether the table exists (1/0), whether its side table does (1/0).
    pub(crate) fn exists(&self, schema: Option<&str>, table: &str) -> String {
        let schema = match schema {
            Some(s) => format!("'{s}'"),
            None => "DATABASE()".to_owned(),
        };
        let count = |t: &str| {
            format!(
                "(SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = {schema} AND table_name = '{t}')"
            )
        };
        format!("SELECT {}, {}", count(table), count(&self.side_name))
    }

    /// Creates the table and its side table (the holds, or Spring's key names) where missing.
    pub(crate) fn create(&self) -> String {
        let (t, side) = (&self.table, &self.side);
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
                ) ENGINE=InnoDB;
                CREATE TABLE IF NOT EXISTS {side} (
                    LOCK_KEY CHAR(36) NOT NULL,
                    REGION VARCHAR(100) NOT NULL,
                    LOCK_NAME VARBINARY(1024) NOT NULL,
                    PRIMARY KEY (LOCK_KEY, REGION)
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
                ) ENGINE=InnoDB;
                CREATE TABLE IF NOT EXISTS {side} (
                    region VARBINARY(256) NOT NULL,
                    lock_key VARBINARY(1024) NOT NULL,
                    token CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                    kind CHAR(1) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                    permits INT NOT NULL,
                    expires_ms BIGINT NOT NULL,
                    fence BIGINT NOT NULL,
                    PRIMARY KEY (region, lock_key, token)
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
    ///
    /// `defer_ms` (for a waiter that another process is ahead of in the queue) leaves a free
    /// lock alone until it has been free that long: the process ahead is being woken to take
    /// it, and only one that does not come (paused, gone) lets the others in.
    pub(crate) fn acquire_existing(
        &self,
        l: &MyLock<'_>,
        lease_ms: i64,
        want_ms: i64,
        defer_ms: Option<i64>,
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
            defer_ms,
        ))
    }

    /// [`acquire_existing`](Self::acquire_existing) as a prepared statement (native layout).
    pub(crate) fn acquire_existing_prepared(&self, defer_ms: Option<i64>) -> Prepared {
        Prepared::new(&self.acquire_existing_with(
            ":tok",
            "region = :region AND lock_key = :key",
            ":lease",
            ":want",
            ":half",
            defer_ms,
        ))
    }

    fn acquire_existing_with(
        &self,
        tok: &str,
        w: &str,
        lease_ms: &str,
        want_ms: &str,
        half: &str,
        defer_ms: Option<i64>,
    ) -> String {
        let t = &self.table;
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        // Same order of assignments as in `acquire`, for the same reason. A released row's
        // `expires_ms` is the time of its release (see `release`), so a deferring waiter's
        // lock is free once it has been released or expired for `defer_ms`.
        let (free, until) = match defer_ms {
            None => (
                format!("(token IS NULL OR token = {tok} OR expires_ms <= {floor})"),
                "expires_ms".to_owned(),
            ),
            Some(d) => (
                format!(
                    "(token = {tok} OR ((token IS NULL OR expires_ms <= {floor})
                                       AND expires_ms <= {floor} - {d}))"
                ),
                format!("(expires_ms + {d})"),
            ),
        };
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
                 {BUSY} + IF({readers}, {SHARED}, 0)
                     + GREATEST({until} - {ceil}, 0))) > 0",
            BUSY = MyOutcome::BUSY,
            SHARED = MyOutcome::READ_SHARED,
            readers = readers_hold("token"),
        )
    }

    /// Two statements; the second returns one row (ours: 0/1, fence, remaining ms, and in the
    /// native layout whether readers hold it: 0/1) or none.
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
             SELECT token = '{tok}', fence, expires_ms - {ceil}, {readers}
             FROM {t} WHERE {w}",
            half = want_ms / 2,
            readers = readers_hold("token"),
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

    /// A released row keeps the time of its release in `expires_ms`, which a deferring
    /// acquisition (see [`acquire_existing`](Self::acquire_existing)) reads.
    fn release_with(t: &str, w: &str, tok: &str) -> String {
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        format!(
            "UPDATE {t} SET token = NULL, expires_ms = {ceil}
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

    /// One statement returning, when held, (fence, remaining ms) in the Spring layout, and
    /// (owner, fence, remaining ms, shares, permits, longest share's remaining ms, waiting
    /// writers) in the native layout.
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
            "SELECT l.token, l.fence, l.expires_ms - {ceil}, {summary} FROM {t} l
             WHERE {w} AND l.token IS NOT NULL AND l.expires_ms > {floor}",
            ceil = my_ms_ceil(),
            floor = my_ms_floor(),
            summary = self.summary(),
        )
    }

    /// The holds of the key of row `l` summed up (see `inspect`).
    fn summary(&self) -> String {
        let h = &self.side;
        let live = format!(
            "x.region = l.region AND x.lock_key = l.lock_key AND x.expires_ms > {}",
            my_ms_floor()
        );
        let shares = format!("x.kind IN ('{READ}', '{PERMIT}')");
        format!(
            "(SELECT COUNT(*) FROM {h} x WHERE {live} AND {shares}),
             (SELECT MAX(x.permits) FROM {h} x WHERE {live} AND x.kind = '{PERMIT}'),
             (SELECT MAX(x.expires_ms) FROM {h} x WHERE {live} AND {shares}) - {ceil},
             (SELECT COUNT(*) FROM {h} x WHERE {live} AND x.kind = '{WRITER}')",
            ceil = my_ms_ceil()
        )
    }

    /// Every held key of `region`, one row each: native (key, then as `inspect`); Spring
    /// (key name or NULL, LOCK_KEY, fence, remaining ms).
    pub(crate) fn list(&self, region: &str) -> String {
        let (t, side) = (&self.table, &self.side);
        if self.spring {
            return format!(
                "SELECT n.LOCK_NAME, l.LOCK_KEY,
                        TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', l.CREATED_DATE),
                        CEIL(TIMESTAMPDIFF(MICROSECOND, {MY_UTC}, l.EXPIRED_AFTER) / 1000)
                 FROM {t} l LEFT JOIN {side} n
                     ON n.LOCK_KEY = l.LOCK_KEY AND n.REGION = l.REGION
                 WHERE l.REGION = {} AND l.EXPIRED_AFTER >= {MY_UTC}",
                text_literal(region)
            );
        }
        format!(
            "SELECT l.lock_key, l.token, l.fence, l.expires_ms - {ceil}, {summary} FROM {t} l
             WHERE l.region = {} AND l.token IS NOT NULL AND l.expires_ms > {floor}",
            hex_literal(region.as_bytes()),
            ceil = my_ms_ceil(),
            floor = my_ms_floor(),
            summary = self.summary(),
        )
    }

    /// Spring layout: records the key name of `l`'s row for `list` (`l.token` unused).
    pub(crate) fn name_key(&self, l: &MyLock<'_>, key: &str) -> String {
        format!(
            "INSERT INTO {} (LOCK_KEY, REGION, LOCK_NAME) VALUES ('{}', {}, {})
             ON DUPLICATE KEY UPDATE LOCK_NAME = LOCK_NAME",
            self.side,
            l.key.replace('\'', ""),
            text_literal(l.region),
            hex_literal(key.as_bytes())
        )
    }

    /// `region = … AND lock_key = …` of row `alias` (native layout).
    fn at(&self, l: &MyLock<'_>, alias: &str) -> String {
        format!(
            "{alias}.region = {} AND {alias}.lock_key = {}",
            hex_literal(l.region.as_bytes()),
            hex_literal(l.key.as_bytes())
        )
    }

    /// Locks the key's row in a transaction (creating it free if missing): every change to a
    /// key's holds is made under it, so the statements after it see all of them.
    fn lock_row(&self, l: &MyLock<'_>) -> String {
        format!(
            "START TRANSACTION;
             INSERT INTO {} (region, lock_key, token, fence, created_ms, expires_ms, wanted_ms)
             VALUES ({}, {}, NULL, 0, 0, 0, NULL) ON DUPLICATE KEY UPDATE fence = fence",
            self.table,
            hex_literal(l.region.as_bytes()),
            hex_literal(l.key.as_bytes())
        )
    }

    /// A lone reader's hold in the key's row (native layout; see `kinds::LONE_READER`), as a
    /// prepared statement: takes a free or expired row that no waiting writer keeps readers
    /// out of (or renews the reader's own); one matched row when it did, with the new fence as
    /// `LAST_INSERT_ID`. Nothing else is written: a busy row, or none, is left to
    /// [`acquire_share`](Self::acquire_share). Its release and renewal are the mutex's
    /// statements with the reader's id as the token.
    pub(crate) fn acquire_lone_prepared(&self) -> Prepared {
        let (t, h) = (&self.table, &self.side);
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        let fence = format!("GREATEST(fence + 1, {MY_US})");
        Prepared::new(&format!(
            "UPDATE {t} SET
                 fence = {fence}, created_ms = {ceil}, expires_ms = {ceil} + :lease, token = :tok
             WHERE region = :region AND lock_key = :key
               AND (token = :tok
                    OR ((token IS NULL OR expires_ms <= {floor})
                        AND NOT EXISTS (SELECT 1 FROM {h} x
                                        WHERE x.region = :region AND x.lock_key = :key
                                          AND x.kind = '{WRITER}' AND x.expires_ms > {floor})))
               AND LAST_INSERT_ID({fence}) > 0"
        ))
    }

    /// The statement of [`acquire_share`](Self::acquire_share)'s transaction whose outcome
    /// the client reads.
    pub(crate) fn share_outcome_at(share: Share) -> usize {
        if share.is_read() {
            4
        } else {
            1
        }
    }

    /// A read hold or a permit for `l.token` (native layout): one transaction in one round
    /// trip. A reader first moves a lone reader in the key's row into the holds table
    /// (statements 1 to 3, after which the row is marked shared). Its `UPDATE` of the key's row
    /// (statement [`share_outcome_at`](Self::share_outcome_at), counting from 0) decides in its
    /// `WHERE` clause, with subqueries on the holds that refer to the row (so that the server
    /// reads them only after it read, and locked, the row; constant ones it may evaluate
    /// before), and keeps the outcome as `LAST_INSERT_ID(expr)` ([`MyShareOutcome`]), which
    /// its `SET` clauses and the `INSERT` of the hold after it act on (both servers return
    /// that value from `LAST_INSERT_ID()` for the rest of the statement, and in the next) and
    /// the client reads from its OK packet. The hold is taken (or renewed, on a repeated
    /// attempt) when the row is free, expired or marked for this kind and nothing keeps the
    /// attempt out (a waiting writer keeps readers out; a full semaphore, or holders with other
    /// permits, keep permits out); the row then carries the share mark, the new fence and a
    /// lease no shorter than any of the kind's (a live row of the kind already outlasts them
    /// all); the hold's own lease ends no later than the row's. Otherwise the row is only
    /// stamped wanted, as the mutex does. Matches no row on the key's first use: then
    /// [`acquire_share_first`](Self::acquire_share_first).
    pub(crate) fn acquire_share(
        &self,
        l: &MyLock<'_>,
        share: Share,
        lease_ms: i64,
        want_ms: i64,
    ) -> String {
        let (t, h) = (&self.table, &self.side);
        let tok = format!("'{}'", l.checked_token());
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        let mw = self.at(l, "m");
        let (code, mark, permits) = (share.code, share.mark, share.permits);
        let live =
            format!("x.region = m.region AND x.lock_key = m.lock_key AND x.expires_ms > {floor}");
        let others = format!("{live} AND x.token <> {tok}");
        let (keeps_out, room, other) = if share.is_read() {
            (
                format!("x.kind = '{WRITER}'"),
                "TRUE".to_owned(),
                "NULL".to_owned(),
            )
        } else {
            (
                format!("x.kind = '{PERMIT}' AND x.permits <> {permits}"),
                format!(
                    "(SELECT COUNT(*) FROM {h} x WHERE {others} AND x.kind = '{PERMIT}') < {permits}"
                ),
                format!(
                    "(SELECT MAX(x.permits) FROM {h} x WHERE {others} AND x.kind = '{PERMIT}'
                        AND x.permits <> {permits})"
                ),
            )
        };
        let ok = format!(
            "(EXISTS (SELECT 1 FROM {h} x WHERE {live} AND x.token = {tok} AND x.kind = '{code}')
              OR ((m.token IS NULL OR m.expires_ms <= {floor} OR m.token = '{mark}')
                  AND NOT EXISTS (SELECT 1 FROM {h} x WHERE {others} AND {keeps_out})
                  AND {room}))"
        );
        let taken = format!("LAST_INSERT_ID() < {}", MyShareOutcome::DISAGREE);
        let lone = if share.is_read() {
            let w = self.where_lock(l);
            let lone = format!("{w} AND token LIKE '{LONE_READER}%' AND expires_ms > {floor}");
            // The row lock first: the INSERT's read of the row would otherwise take a shared
            // lock that two transactions could each hold while waiting to write the row.
            format!(
                "SELECT 1 FROM {t} WHERE {w} FOR UPDATE;
                 INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence)
                 SELECT region, lock_key, token, '{READ}', 0, expires_ms, fence FROM {t}
                 WHERE {lone}
                 ON DUPLICATE KEY UPDATE kind = VALUES(kind), permits = VALUES(permits),
                     expires_ms = VALUES(expires_ms), fence = VALUES(fence);
                 UPDATE {t} SET token = '{READ_MARK}' WHERE {lone};"
            )
        } else {
            String::new()
        };
        // `expires_ms` is assigned first, so that it reads the row's own `token` and
        // `expires_ms` whether the server applies the assignments left to right or all at once.
        format!(
            "START TRANSACTION;
             {lone}
             UPDATE {t} AS m SET
                 expires_ms = IF({taken},
                     IF(token = '{mark}' AND expires_ms > {floor},
                        GREATEST(expires_ms, {ceil} + {lease_ms}), {ceil} + {lease_ms}),
                     expires_ms),
                 wanted_ms = IF(LAST_INSERT_ID() >= {BUSY} AND IFNULL(wanted_ms < {ceil} + {half}, TRUE),
                     {ceil} + {want_ms}, wanted_ms),
                 created_ms = IF({taken}, {ceil}, created_ms),
                 token = IF({taken}, '{mark}', token),
                 fence = IF({taken}, LAST_INSERT_ID() DIV 2, fence)
             WHERE {mw} AND LAST_INSERT_ID(IF({ok}, GREATEST(m.fence + 1, {MY_US}) * 2,
                 IF({other} IS NOT NULL, {DISAGREE} + {other},
                    {BUSY} + GREATEST(m.expires_ms - {ceil}, 0)))) > 0;
             INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence)
             SELECT m.region, m.lock_key, {tok}, '{code}', {permits},
                    LEAST({ceil} + {lease_ms}, m.expires_ms), m.fence
             FROM {t} m
             WHERE {mw} AND {taken} AND m.token = '{mark}' AND m.fence = LAST_INSERT_ID() DIV 2
             ON DUPLICATE KEY UPDATE kind = VALUES(kind), permits = VALUES(permits),
                 expires_ms = VALUES(expires_ms), fence = VALUES(fence);
             COMMIT",
            half = want_ms / 2,
            DISAGREE = MyShareOutcome::DISAGREE,
            BUSY = MyOutcome::BUSY,
        )
    }

    /// [`acquire_share`](Self::acquire_share) on the key's first use (no row yet): one
    /// transaction in one round trip that creates the row. After the row lock: the hold is taken (or renewed, on a repeated attempt) when
    /// the row is free, expired or marked for this kind and nothing keeps the attempt out (a
    /// waiting writer keeps readers out; a full semaphore, or holders with other permits,
    /// keep permits out); the row then carries the share mark, the new fence and the longest
    /// lease of this kind's holds. Otherwise the row is only stamped wanted, as the mutex
    /// does. The last result: (the fence if taken, else NULL; other holders' permits or NULL;
    /// the row's remaining ms).
    pub(crate) fn acquire_share_first(
        &self,
        l: &MyLock<'_>,
        share: Share,
        lease_ms: i64,
        want_ms: i64,
    ) -> String {
        let (t, h) = (&self.table, &self.side);
        let tok = format!("'{}'", l.checked_token());
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        let (xw, mw, w) = (self.at(l, "x"), self.at(l, "m"), self.where_lock(l));
        let (code, mark, permits) = (share.code, share.mark, share.permits);
        let live = format!("{xw} AND x.expires_ms > {floor}");
        let keeps_out = if share.is_read() {
            format!("x.kind = '{WRITER}'")
        } else {
            format!("x.kind = '{PERMIT}' AND x.permits <> {permits}")
        };
        let room = if share.is_read() {
            "TRUE".to_owned()
        } else {
            format!(
                "(SELECT COUNT(*) FROM {h} x WHERE {live} AND x.kind = '{PERMIT}'
                    AND x.token <> {tok}) < {permits}"
            )
        };
        let held = format!(
            "(SELECT x.fence FROM {h} x WHERE {live} AND x.token = {tok} AND x.kind = '{code}')"
        );
        format!(
            "{lock};
             INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence)
             SELECT m.region, m.lock_key, {tok}, '{code}', {permits}, {ceil} + {lease_ms},
                    GREATEST(m.fence + 1, {MY_US})
             FROM {t} m
             WHERE {mw} AND (
                 EXISTS (SELECT 1 FROM {h} x WHERE {live} AND x.token = {tok} AND x.kind = '{code}')
                 OR ((m.token IS NULL OR m.expires_ms <= {floor} OR m.token = '{mark}')
                     AND NOT EXISTS (SELECT 1 FROM {h} x WHERE {live} AND x.token <> {tok}
                                       AND {keeps_out})
                     AND {room}))
             ON DUPLICATE KEY UPDATE kind = VALUES(kind), permits = VALUES(permits),
                 expires_ms = VALUES(expires_ms), fence = VALUES(fence);
             UPDATE {t} SET
                 token = IF(IFNULL({held} > fence, FALSE), '{mark}', token),
                 created_ms = IF(IFNULL({held} > fence, FALSE), {ceil}, created_ms),
                 expires_ms = IF(IFNULL({held} > fence, FALSE),
                     (SELECT MAX(x.expires_ms) FROM {h} x WHERE {live} AND x.kind = '{code}'),
                     expires_ms),
                 wanted_ms = IF(IFNULL({held} > fence, FALSE) OR wanted_ms >= {ceil} + {half},
                     wanted_ms, {ceil} + {want_ms}),
                 fence = IF(IFNULL({held} > fence, FALSE), {held}, fence)
             WHERE {w};
             SELECT (SELECT x.fence FROM {h} x WHERE {live} AND x.token = {tok}
                       AND x.kind = '{code}' AND x.fence = m.fence),
                    (SELECT MAX(x.permits) FROM {h} x WHERE {live} AND x.token <> {tok}
                       AND x.kind = '{PERMIT}' AND x.permits <> {permits}),
                    m.expires_ms - {ceil}
             FROM {t} m WHERE {mw};
             DELETE FROM {h} WHERE {region} AND expires_ms <= {floor};
             COMMIT",
            lock = self.lock_row(l),
            half = want_ms / 2,
            region = self.where_lock(l),
        )
    }

    /// Gives `l.token`'s share back (native layout), in one transaction in one round trip:
    /// its `UPDATE` of the key's row (statement 1) matches when the share was live and the row
    /// is still marked shared, and keeps (as `LAST_INSERT_ID`, see
    /// [`acquire_share`](Self::acquire_share)) the longest lease of the shares left (·4, 0 for
    /// none: the row keeps it, or is free) plus 2 when a waiter stamped the row, plus 1. Then
    /// the share and whatever expired are removed.
    pub(crate) fn release_share(&self, l: &MyLock<'_>) -> String {
        let (t, h) = (&self.table, &self.side);
        let tok = format!("'{}'", l.checked_token());
        let floor = my_ms_floor();
        let (mw, w) = (self.at(l, "m"), self.where_lock(l));
        let shares = format!(
            "x.region = m.region AND x.lock_key = m.lock_key AND x.kind IN ('{READ}', '{PERMIT}')
             AND x.expires_ms > {floor}"
        );
        format!(
            "START TRANSACTION;
             UPDATE {t} AS m SET
                 token = IF(LAST_INSERT_ID() DIV 4 = 0, NULL, token),
                 expires_ms = IF(LAST_INSERT_ID() DIV 4 = 0, expires_ms, LAST_INSERT_ID() DIV 4)
             WHERE {mw} AND m.token IN ('{READ_MARK}', '{SEM_MARK}')
               AND EXISTS (SELECT 1 FROM {h} x WHERE {shares} AND x.token = {tok})
               AND LAST_INSERT_ID(
                   IFNULL((SELECT MAX(x.expires_ms) FROM {h} x WHERE {shares} AND x.token <> {tok}), 0) * 4
                   + IFNULL(m.wanted_ms > {floor}, 0) * 2 + 1) > 0;
             DELETE FROM {h} WHERE {w} AND (token = {tok} OR expires_ms <= {floor});
             COMMIT"
        )
    }

    /// Renews `l.token`'s share (native layout), in one transaction in one round trip: after
    /// the row lock, its `UPDATE` (statement 2) raises the key's row lease, and matches when the
    /// share was live; the share's lease then ends no later than the row's.
    pub(crate) fn extend_share(&self, l: &MyLock<'_>, lease_ms: i64) -> String {
        let (t, h) = (&self.table, &self.side);
        let tok = format!("'{}'", l.checked_token());
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        let (xw, mw, w) = (self.at(l, "x"), self.at(l, "m"), self.where_lock(l));
        let marks = format!("('{READ_MARK}', '{SEM_MARK}')");
        let shares = format!("kind IN ('{READ}', '{PERMIT}') AND expires_ms > {floor}");
        format!(
            "START TRANSACTION;
             SELECT 1 FROM {t} WHERE {w} FOR UPDATE;
             UPDATE {t} SET expires_ms = GREATEST(expires_ms, {ceil} + {lease_ms})
             WHERE {w} AND token IN {marks}
               AND EXISTS (SELECT 1 FROM {h} x WHERE {xw} AND x.token = {tok} AND x.{shares});
             UPDATE {h} SET
                 expires_ms = LEAST({ceil} + {lease_ms}, (SELECT m.expires_ms FROM {t} m WHERE {mw}))
             WHERE {w} AND token = {tok} AND {shares}
               AND EXISTS (SELECT 1 FROM {t} m WHERE {mw} AND m.token IN {marks});
             COMMIT"
        )
    }

    /// Takes or renews a waiting writer's place (`l.token`, the waiter's token) while readers
    /// hold the key (native layout); affected rows tell whether it did.
    pub(crate) fn writer_place(&self, l: &MyLock<'_>) -> String {
        let (t, h) = (&self.table, &self.side);
        let tok = format!("'{}'", l.checked_token());
        format!(
            "INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence)
             SELECT region, lock_key, {tok}, '{WRITER}', 0, {} + {WRITER_PLACE_MS}, 0 FROM {t}
             WHERE {} AND {} AND expires_ms > {}
             ON DUPLICATE KEY UPDATE expires_ms = VALUES(expires_ms)",
            my_ms_ceil(),
            self.where_lock(l),
            readers_hold("token"),
            my_ms_floor()
        )
    }

    /// Gives a waiting writer's place back (native layout); affected rows tell whether it had
    /// one.
    pub(crate) fn leave(&self, l: &MyLock<'_>) -> String {
        format!(
            "DELETE FROM {} WHERE {} AND token = '{}' AND kind = '{WRITER}'",
            self.side,
            self.where_lock(l),
            l.checked_token()
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
            // Shares leave room too: readers without a waiting writer let readers in, a
            // semaphore with fewer holders than permits lets permits in.
            let h = &self.side;
            let held = format!(
                "x.region = m.region AND x.lock_key = m.lock_key AND x.expires_ms > {}",
                my_ms_floor()
            );
            format!(
                "m.token IS NOT NULL AND m.expires_ms > {}
                 AND NOT ({readers}
                          AND NOT EXISTS (SELECT 1 FROM {h} x WHERE {held} AND x.kind = '{WRITER}'))
                 AND NOT (m.token = '{SEM_MARK}'
                          AND (SELECT COUNT(*) FROM {h} x WHERE {held} AND x.kind = '{PERMIT}')
                              < (SELECT MAX(x.permits) FROM {h} x WHERE {held} AND x.kind = '{PERMIT}'))",
                my_ms_floor(),
                readers = readers_hold("m.token"),
            )
        };
        let free = format!("NOT EXISTS (SELECT 1 FROM {t} m WHERE {w} AND {live})");
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

    /// Spring layout: one statement; affected rows tell whether a live hold existed. Native
    /// layout: one transaction after the row lock that removes every holder, of any kind;
    /// the last result: (a holder was live 0/1).
    pub(crate) fn force_delete(&self, l: &MyLock<'_>) -> String {
        let (t, h) = (&self.table, &self.side);
        let w = self.where_lock(l);
        if self.spring {
            return format!("DELETE FROM {t} WHERE {w} AND EXPIRED_AFTER >= {MY_UTC}");
        }
        let floor = my_ms_floor();
        let shares = format!("kind IN ('{READ}', '{PERMIT}')");
        format!(
            "{lock};
             SELECT EXISTS (SELECT 1 FROM {t} WHERE {w} AND token IS NOT NULL AND expires_ms > {floor})
                 OR EXISTS (SELECT 1 FROM {h} WHERE {w} AND {shares} AND expires_ms > {floor});
             DELETE FROM {h} WHERE {w} AND ({shares} OR expires_ms <= {floor});
             UPDATE {t} SET token = NULL WHERE {w} AND token IS NOT NULL;
             COMMIT",
            lock = self.lock_row(l),
        )
    }
}
