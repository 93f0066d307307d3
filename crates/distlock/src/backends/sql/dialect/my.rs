//! MySQL / MariaDB statements: built per call as text, every value a literal that cannot break
//! out of it, so that a statement and the `SELECT` reading its outcome travel in one round trip.

use std::fmt::Write as _;

/// MySQL / MariaDB statements, built per call.
#[derive(Debug, Clone)]
pub(crate) struct My {
    table: String,
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
