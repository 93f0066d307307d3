//! MySQL / MariaDB statements of ShedLock's table (see `sql::shedlock`): ShedLock's own
//! statements with the database's time (`usingDbTime()`: `UTC_TIMESTAMP(3)`), with the
//! results the Spring layout's statements give, so that the backend reads them the same way.
//! The `MyLock`'s `key` is the `name`, its `token` the token's hex, its `described` the
//! whole `locked_by` (acquisitions only); its region is the namespace, used by `list` alone.

use std::fmt::Write as _;

use super::{text_literal, My, MyLock};

/// ShedLock's `now` with `usingDbTime()`, already whole milliseconds like the columns.
pub(super) const NOW: &str = "UTC_TIMESTAMP(3)";
/// The fence reported: `locked_at` in microseconds.
pub(super) const FENCE: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', locked_at)";

/// The remaining lease of the row, in ms.
fn remaining() -> String {
    format!("CEIL(TIMESTAMPDIFF(MICROSECOND, {NOW}, lock_until) / 1000)")
}

/// distlock's hold with the (checked hex) token `tok`.
fn ours(tok: &str) -> String {
    format!("RIGHT(locked_by, 34) = ' #{tok}'")
}

impl My {
    /// The row of `l`: its `name`.
    pub(super) fn shed_where(&self, l: &MyLock<'_>) -> String {
        format!("name = {}", text_literal(l.key))
    }

    /// ShedLock's documented table. Both times get an explicit default, so that a server
    /// with `explicit_defaults_for_timestamp` off does not make `lock_until` a column that
    /// every update sets to the current time.
    pub(super) fn shed_create(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (
                name VARCHAR(64) NOT NULL,
                lock_until TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                locked_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                locked_by VARCHAR(255) NOT NULL,
                PRIMARY KEY (name)
            )",
            self.table
        )
    }

    /// (fence, remaining ms, NULL, locked_by) when held.
    pub(super) fn shed_inspect(&self, l: &MyLock<'_>) -> String {
        format!(
            "SELECT {FENCE}, {rem}, NULL, locked_by FROM {t}
             WHERE {w} AND lock_until > {NOW}",
            t = self.table,
            w = self.shed_where(l),
            rem = remaining(),
        )
    }

    /// The held rows of namespace `ns` (`sql::shedlock::namespace`; every held row for the
    /// bare one): (key, name, then as `shed_inspect`).
    pub(super) fn shed_list(&self, ns: &str) -> String {
        let (key, only) = if ns.is_empty() {
            ("name".to_owned(), String::new())
        } else {
            let p = text_literal(ns);
            (
                format!("SUBSTRING(name, CHAR_LENGTH({p}) + 2)"),
                format!("LEFT(name, CHAR_LENGTH({p}) + 1) = CONCAT({p}, ':') AND"),
            )
        };
        format!(
            "SELECT {key}, name, {FENCE}, {rem}, NULL, locked_by FROM {t}
             WHERE {only} lock_until > {NOW}",
            t = self.table,
            rem = remaining(),
        )
    }

    /// ShedLock's insert-or-take (`INSERT … ON DUPLICATE KEY UPDATE` with `IF()` on each
    /// column), then (ours 0/1, fence, remaining ms).
    pub(super) fn shed_acquire(&self, l: &MyLock<'_>, lease_ms: i64) -> String {
        let (t, tok) = (&self.table, l.checked_token());
        let w = self.shed_where(l);
        // Assignments may see the ones before them (MySQL, and MariaDB by default) or the
        // original row (MariaDB's SIMULTANEOUS_ASSIGNMENT). `free` reads `lock_until` and
        // `locked_by`; `locked_by` is assigned before `lock_until`, and once it is ours
        // `free` stays true, so every assignment sees the same answer under both rules.
        let free = format!("(lock_until <= {NOW} OR {})", ours(tok));
        format!(
            "INSERT INTO {t} (name, lock_until, locked_at, locked_by)
             VALUES ({name}, {NOW} + INTERVAL {lease_us} MICROSECOND, {NOW}, {by})
             ON DUPLICATE KEY UPDATE
                 locked_at = IF({free}, VALUES(locked_at), locked_at),
                 locked_by = IF({free}, VALUES(locked_by), locked_by),
                 lock_until = IF({free}, VALUES(lock_until), lock_until);
             SELECT {ours} AND lock_until > {NOW}, {FENCE}, {rem} FROM {t} WHERE {w}",
            name = text_literal(l.key),
            by = text_literal(l.described),
            lease_us = lease_ms.saturating_mul(1000),
            ours = ours(tok),
            rem = remaining(),
        )
    }

    /// ShedLock's unlock with no lock-at-least (`lock_until` back to now, the row stays),
    /// then (released 0/1, 0).
    pub(super) fn shed_release(&self, l: &MyLock<'_>) -> String {
        format!(
            "UPDATE {t} SET lock_until = GREATEST(locked_at, {NOW})
             WHERE {w} AND {ours} AND lock_until > {NOW};
             SELECT ROW_COUNT(), 0",
            t = self.table,
            w = self.shed_where(l),
            ours = ours(l.checked_token()),
        )
    }

    /// ShedLock's extend; the matched rows tell whether it was extended.
    pub(super) fn shed_extend(&self, l: &MyLock<'_>, lease_ms: i64) -> String {
        format!(
            "UPDATE {t} SET lock_until = {NOW} + INTERVAL {lease_us} MICROSECOND
             WHERE {w} AND {ours} AND lock_until > {NOW}",
            t = self.table,
            w = self.shed_where(l),
            ours = ours(l.checked_token()),
            lease_us = lease_ms.saturating_mul(1000),
        )
    }

    /// The batch's renewals, then the (index) of each entry that holds its row.
    pub(super) fn shed_extend_many(&self, batch: &[(MyLock<'_>, i64)]) -> String {
        let t = &self.table;
        let mut derived = String::new();
        for (i, (l, lease_ms)) in batch.iter().enumerate() {
            if i > 0 {
                derived.push_str(" UNION ALL ");
            }
            let _ = write!(
                derived,
                "SELECT {i} AS i, {} AS k, ' #{}' AS c, {lease_ms} AS l",
                text_literal(l.key),
                l.checked_token()
            );
        }
        let on = format!("{t}.name = b.k AND RIGHT({t}.locked_by, 34) = b.c");
        format!(
            "UPDATE {t} JOIN ({derived}) b ON {on}
             SET {t}.lock_until = {NOW} + INTERVAL b.l * 1000 MICROSECOND
             WHERE {t}.lock_until > {NOW};
             SELECT b.i FROM {t} JOIN ({derived}) b ON {on}
             WHERE {t}.lock_until > {NOW}"
        )
    }

    /// Released whoever holds it; the matched rows tell whether a hold was live.
    pub(super) fn shed_force(&self, l: &MyLock<'_>) -> String {
        format!(
            "UPDATE {t} SET lock_until = GREATEST(locked_at, {NOW})
             WHERE {w} AND lock_until > {NOW}",
            t = self.table,
            w = self.shed_where(l),
        )
    }
}
