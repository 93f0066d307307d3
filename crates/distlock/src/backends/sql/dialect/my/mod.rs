//! MySQL / MariaDB statements: built per call as text, every value a literal that cannot break
//! out of it, so that a statement and the `SELECT` reading its outcome travel in one round trip.
//! Here: the statement types and outcomes, the tables' DDL, reading and listing holds, the
//! doorbell's look and the forced release; the mutex's cycle is in `mutex`, the shared kinds'
//! statements in `kinds`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::backends::sql::kinds::{
    holds_table, names_table, owners_table, LONE_READER, OWNER_SEP, PERMIT, READ, READ_MARK,
    SEM_MARK, WRITER,
};

mod kinds;
mod mutex;
mod shedlock;

pub(crate) use self::kinds::ShareAsk;

/// MySQL / MariaDB statements, built per call.
#[derive(Debug, Clone)]
pub(crate) struct My {
    table: String,
    /// Native: the holds table; Spring: the key names (see `sql::kinds`).
    side: String,
    /// The side table's unquoted name, for `exists`.
    side_name: String,
    /// Spring: the holders' descriptions (see `sql::kinds::owners_table`), and its unquoted
    /// name.
    owners: String,
    owners_name: String,
    /// Spring: whether `owners` exists (a table Spring made, with `create_table=false`, may
    /// have none; then nothing is recorded and the `CLIENT_ID` is shown).
    described: Arc<AtomicBool>,
    spring: bool,
    /// ShedLock's table (see `sql::shedlock`; its statements are in `shedlock.rs`).
    shedlock: bool,
}

/// The type of a description column: bytes, so that whatever another writer stored reads
/// back (and is made fit to show by `Owner::shown`).
const OWNER_TYPE: &str = "VARBINARY(512)";

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
    /// The holder's description, written by the acquisitions (empty elsewhere).
    pub(crate) described: &'a str,
}

impl<'a> MyLock<'a> {
    /// The lock at row `(region, key)` with `token`, and no description (only acquisitions
    /// write one).
    pub(crate) fn new(region: &'a str, key: &'a str, token: &'a str) -> Self {
        MyLock {
            region,
            key,
            token,
            described: "",
        }
    }

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
    const NAMES: [&'static str; 7] = ["region", "key", "tok", "lease", "want", "half", "own"];

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
        let owners_name = owners_table(table);
        My {
            table: quote(table),
            side: quote(&side_name),
            side_name,
            owners: quote(&owners_name),
            owners_name,
            described: Arc::new(AtomicBool::new(true)),
            spring,
            shedlock: false,
        }
    }

    /// ShedLock's table.
    pub(crate) fn shedlock(schema: Option<&str>, table: &str) -> Self {
        My {
            shedlock: true,
            ..Self::new(schema, table, false)
        }
    }

    /// Spring layout: whether the owners table exists (see [`My::exists`]).
    pub(crate) fn set_described(&self, described: bool) {
        self.described.store(described, Ordering::Release);
    }

    /// Spring layout: whether to record and read the holders' descriptions.
    fn spring_owners(&self) -> bool {
        self.described.load(Ordering::Acquire)
    }

    /// One row: whether the table exists (1/0), whether its side table does (1/0), and where
    /// the holders' descriptions go: native, whether the table has its `owner` column (1/0),
    /// whether the side table has (1/0); Spring, whether the owners table exists (twice).
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
        let column = |t: &str| {
            format!(
                "(SELECT COUNT(*) FROM information_schema.columns \
                 WHERE table_schema = {schema} AND table_name = '{t}' AND column_name = 'owner')"
            )
        };
        if self.shedlock {
            return format!("SELECT {}, 1, 1, 1", count(table));
        }
        if self.spring {
            let o = count(&self.owners_name);
            return format!(
                "SELECT {}, {}, {o}, {o}",
                count(table),
                count(&self.side_name)
            );
        }
        format!(
            "SELECT {}, {}, {}, {}",
            count(table),
            count(&self.side_name),
            column(table),
            column(&self.side_name)
        )
    }

    /// Native layout: adds the `owner` column to the lease table (`side` false) or the holds
    /// table, made before the holders' descriptions were recorded. (MySQL has no
    /// `ADD COLUMN IF NOT EXISTS`: the caller checks first.)
    pub(crate) fn add_owner_column(&self, side: bool) -> String {
        let t = if side { &self.side } else { &self.table };
        format!("ALTER TABLE {t} ADD COLUMN owner {OWNER_TYPE} NULL")
    }

    /// Creates the table and its side table (the holds, or Spring's key names) where missing.
    pub(crate) fn create(&self) -> String {
        let (t, side) = (&self.table, &self.side);
        if self.shedlock {
            return self.shed_create();
        }
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
                ) ENGINE=InnoDB;
                CREATE TABLE IF NOT EXISTS {owners} (
                    LOCK_KEY CHAR(36) NOT NULL,
                    REGION VARCHAR(100) NOT NULL,
                    CLIENT_ID CHAR(36) NOT NULL,
                    OWNER {OWNER_TYPE} NOT NULL,
                    PRIMARY KEY (LOCK_KEY, REGION)
                ) ENGINE=InnoDB",
                owners = self.owners
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
                    owner {OWNER_TYPE} NULL,
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
                    owner {OWNER_TYPE} NULL,
                    PRIMARY KEY (region, lock_key, token)
                ) ENGINE=InnoDB"
            )
        }
    }

    fn where_lock(&self, l: &MyLock<'_>) -> String {
        if self.shedlock {
            self.shed_where(l)
        } else if self.spring {
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

    /// One statement returning, when held, (fence, remaining ms) in the Spring layout, and
    /// (owner, fence, remaining ms, shares, permits, longest share's remaining ms, waiting
    /// writers) in the native layout.
    pub(crate) fn inspect(&self, l: &MyLock<'_>) -> String {
        let t = &self.table;
        let w = self.where_lock(l);
        if self.shedlock {
            return self.shed_inspect(l);
        }
        if self.spring {
            return format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', CREATED_DATE),
                        CEIL(TIMESTAMPDIFF(MICROSECOND, {MY_UTC}, EXPIRED_AFTER) / 1000),
                        {described}
                 FROM {t} l WHERE {w} AND EXPIRED_AFTER >= {MY_UTC}",
                described = self.spring_described()
            );
        }
        format!(
            "SELECT l.token, l.fence, l.expires_ms - {ceil}, {summary}, l.owner FROM {t} l
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
             (SELECT COUNT(*) FROM {h} x WHERE {live} AND x.kind = '{WRITER}'),
             (SELECT GROUP_CONCAT(IFNULL(x.owner, '') SEPARATOR X'{sep:02x}')
              FROM {h} x WHERE {live} AND {shares})",
            ceil = my_ms_ceil(),
            sep = OWNER_SEP as u32,
        )
    }

    /// Spring layout, row `l`: (distlock's description of the holder, its `CLIENT_ID`).
    fn spring_described(&self) -> String {
        if !self.spring_owners() {
            return "NULL, l.CLIENT_ID".to_owned();
        }
        format!(
            "(SELECT o.OWNER FROM {} o
              WHERE o.LOCK_KEY = l.LOCK_KEY AND o.REGION = l.REGION AND o.CLIENT_ID = l.CLIENT_ID),
             l.CLIENT_ID",
            self.owners
        )
    }

    /// Every held key of `region`, one row each: native (key, then as `inspect`); Spring
    /// (key name or NULL, LOCK_KEY, fence, remaining ms).
    pub(crate) fn list(&self, region: &str) -> String {
        let (t, side) = (&self.table, &self.side);
        if self.shedlock {
            return self.shed_list(region);
        }
        if self.spring {
            return format!(
                "SELECT n.LOCK_NAME, l.LOCK_KEY,
                        TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', l.CREATED_DATE),
                        CEIL(TIMESTAMPDIFF(MICROSECOND, {MY_UTC}, l.EXPIRED_AFTER) / 1000),
                        {described}
                 FROM {t} l LEFT JOIN {side} n
                     ON n.LOCK_KEY = l.LOCK_KEY AND n.REGION = l.REGION
                 WHERE l.REGION = {} AND l.EXPIRED_AFTER >= {MY_UTC}",
                text_literal(region),
                described = self.spring_described()
            );
        }
        format!(
            "SELECT l.lock_key, l.token, l.fence, l.expires_ms - {ceil}, {summary}, l.owner
             FROM {t} l
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

    /// A waiter's look at a lock's doorbell (see `mysql/doorbell.rs`), one row: who held the
    /// doorbell when the statement began (connection id, 0 for nobody), whether the lock is
    /// free now (1/0), whether the doorbell was taken and given back (1; 0 when the lock was
    /// free, so nobody waited, or after `wait_s` seconds), and the lock's version at the end
    /// (native layout: the fence; Spring: the creation time; NULL without a row), which tells
    /// a later look whether somebody took the lock meanwhile.
    /// `OWN_SESSIONS` in the statement is replaced by the connection ids of the caller's own
    /// sessions, which hold its doorbells (a doorbell held by one of them is not waited for).
    pub(crate) fn doorbell_wait(&self, l: &MyLock<'_>, doorbell: &str, wait_s: f64) -> String {
        let t = &self.table;
        let w = self.where_lock(l);
        let live = if self.shedlock {
            format!("lock_until > {}", shedlock::NOW)
        } else if self.spring {
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
        let version = if self.shedlock {
            shedlock::FENCE
        } else if self.spring {
            "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', CREATED_DATE)"
        } else {
            "fence"
        };
        format!(
            "SELECT IFNULL(IS_USED_LOCK('{doorbell}'), 0), {free},
                    IF({free} OR IFNULL(IS_USED_LOCK('{doorbell}'), 0) IN (OWN_SESSIONS), 0,
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
        if self.shedlock {
            return self.shed_force(l);
        }
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
             UPDATE {t} SET token = NULL, owner = NULL WHERE {w} AND token IS NOT NULL;
             COMMIT",
            lock = self.lock_row(l),
        )
    }
}
