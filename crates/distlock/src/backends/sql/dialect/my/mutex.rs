//! The mutex's cycle in MySQL / MariaDB (also Spring's layout): taking the key's row, given
//! back, renewed one at a time or in batches.

use std::fmt::Write as _;

use super::{
    hex_literal, my_ms_ceil, my_ms_floor, readers_hold, text_literal, My, MyLock, MyOutcome,
    Prepared, MY_US, MY_UTC,
};

impl My {
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
        if self.spring || self.shedlock {
            return None;
        }
        let tok = format!("'{}'", l.checked_token());
        let w = self.where_lock(l);
        Some(self.acquire_existing_with(
            (&tok, &hex_literal(l.described.as_bytes())),
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
            (":tok", ":own"),
            "region = :region AND lock_key = :key",
            ":lease",
            ":want",
            ":half",
            defer_ms,
        ))
    }

    fn acquire_existing_with(
        &self,
        (tok, own): (&str, &str),
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
                 owner = IF({free}, {own}, owner),
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
        if self.shedlock {
            return self.shed_acquire(l, lease_ms);
        }
        let t = &self.table;
        let tok = l.checked_token();
        let w = self.where_lock(l);
        if self.spring {
            let key = l.key.replace('\'', "");
            let region = text_literal(l.region);
            let own = hex_literal(l.described.as_bytes());
            let described = if self.spring_owners() {
                format!(
                    "INSERT INTO {owners} (LOCK_KEY, REGION, CLIENT_ID, OWNER)
                     SELECT LOCK_KEY, REGION, CLIENT_ID, {own} FROM {t}
                     WHERE {w} AND CLIENT_ID = '{tok}'
                     ON DUPLICATE KEY UPDATE CLIENT_ID = VALUES(CLIENT_ID), OWNER = VALUES(OWNER);",
                    owners = self.owners
                )
            } else {
                String::new()
            };
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
                 {described}
                 SELECT CLIENT_ID = '{tok}', {fence},
                        CEIL(TIMESTAMPDIFF(MICROSECOND, {MY_UTC}, EXPIRED_AFTER) / 1000)
                 FROM {t} WHERE {w}",
                lease_us = lease_ms * 1000,
            );
        }
        let (floor, ceil) = (my_ms_floor(), my_ms_ceil());
        let own = hex_literal(l.described.as_bytes());
        let region = hex_literal(l.region.as_bytes());
        let key = hex_literal(l.key.as_bytes());
        // MySQL (and MariaDB by default) apply the assignments left to right, each seeing the
        // columns assigned before it; MariaDB's SIMULTANEOUS_ASSIGNMENT mode shows them all the
        // original row. `free` reads only `token` and `expires_ms`, assigned last in this order,
        // so every assignment sees the same answer under both rules (after `token` is taken,
        // `token = VALUES(token)` keeps `free` true for `expires_ms`).
        let free = format!("(token IS NULL OR token = VALUES(token) OR expires_ms <= {floor})");
        format!(
            "INSERT INTO {t} (region, lock_key, token, fence, created_ms, expires_ms, wanted_ms, owner)
             VALUES ({region}, {key}, '{tok}', {MY_US}, {ceil}, {ceil} + {lease_ms}, NULL, {own})
             ON DUPLICATE KEY UPDATE
                 fence = IF({free}, GREATEST(fence + 1, VALUES(fence)), fence),
                 wanted_ms = IF({free} OR wanted_ms >= VALUES(created_ms) + {half}, wanted_ms,
                                VALUES(created_ms) + {want_ms}),
                 created_ms = IF({free}, VALUES(created_ms), created_ms),
                 owner = IF({free}, VALUES(owner), owner),
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
        if self.shedlock {
            return self.shed_release(l);
        }
        let t = &self.table;
        let tok = l.checked_token();
        let w = self.where_lock(l);
        if self.spring {
            let mut sql = format!(
                "DELETE FROM {t} WHERE {w} AND CLIENT_ID = '{tok}' AND EXPIRED_AFTER >= {MY_UTC};
                 SELECT ROW_COUNT(), 0"
            );
            if self.spring_owners() {
                let _ = write!(
                    sql,
                    ";\n DELETE FROM {} WHERE {w} AND CLIENT_ID = '{tok}'",
                    self.owners
                );
            }
            return sql;
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
            "UPDATE {t} SET token = NULL, owner = NULL, expires_ms = {ceil}
             WHERE {w} AND token = {tok} AND expires_ms > {floor}
               AND LAST_INSERT_ID(1 + IFNULL(wanted_ms > {floor}, 0)) > 0"
        )
    }

    /// One statement; affected rows (with CLIENT_FOUND_ROWS) tell whether it was extended.
    pub(crate) fn extend(&self, l: &MyLock<'_>, lease_ms: i64) -> String {
        if self.shedlock {
            return self.shed_extend(l, lease_ms);
        }
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
        if self.shedlock {
            return self.shed_extend_many(batch);
        }
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
}
