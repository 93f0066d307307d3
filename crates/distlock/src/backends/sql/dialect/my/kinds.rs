//! The shared kinds in MySQL / MariaDB (native layout): read holds and semaphore permits in
//! the holds table, and a waiting writer's place that keeps new readers out.

use super::{
    hex_literal, my_ms_ceil, my_ms_floor, readers_hold, My, MyLock, MyOutcome, MyShareOutcome,
    Prepared, MY_US,
};
use crate::backends::sql::kinds::{
    Share, LONE_READER, PERMIT, READ, READ_MARK, SEM_MARK, WRITER, WRITER_PLACE_MS,
};

/// One share attempt, as both statements of [`My::acquire_share`] and
/// [`My::acquire_share_first`] build it.
pub(crate) struct ShareAsk<'l, 'a> {
    /// The lock, with the hold's token and description.
    pub(crate) lock: &'l MyLock<'a>,
    /// The kind of hold asked for.
    pub(crate) share: Share,
    /// The hold's lease.
    pub(crate) lease_ms: i64,
    /// How long a busy attempt marks the row wanted.
    pub(crate) want_ms: i64,
}

impl ShareAsk<'_, '_> {
    /// The SQL values both statements use: the quoted token, the owner as a hex literal, and
    /// the server clock's milliseconds rounded down and up.
    fn values(&self) -> [String; 4] {
        [
            format!("'{}'", self.lock.checked_token()),
            hex_literal(self.lock.described.as_bytes()),
            my_ms_floor(),
            my_ms_ceil(),
        ]
    }
}

impl My {
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
                 fence = {fence}, created_ms = {ceil}, expires_ms = {ceil} + :lease, owner = :own,
                 token = :tok
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
    pub(crate) fn acquire_share(&self, ask: &ShareAsk<'_, '_>) -> String {
        let (t, h) = (&self.table, &self.side);
        let (l, share, lease_ms, want_ms) = (ask.lock, ask.share, ask.lease_ms, ask.want_ms);
        let [tok, own, floor, ceil] = ask.values();
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
                 INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence, owner)
                 SELECT region, lock_key, token, '{READ}', 0, expires_ms, fence, owner FROM {t}
                 WHERE {lone}
                 ON DUPLICATE KEY UPDATE kind = VALUES(kind), permits = VALUES(permits),
                     expires_ms = VALUES(expires_ms), fence = VALUES(fence), owner = VALUES(owner);
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
             INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence, owner)
             SELECT m.region, m.lock_key, {tok}, '{code}', {permits},
                    LEAST({ceil} + {lease_ms}, m.expires_ms), m.fence, {own}
             FROM {t} m
             WHERE {mw} AND {taken} AND m.token = '{mark}' AND m.fence = LAST_INSERT_ID() DIV 2
             ON DUPLICATE KEY UPDATE kind = VALUES(kind), permits = VALUES(permits),
                 expires_ms = VALUES(expires_ms), fence = VALUES(fence), owner = VALUES(owner);
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
    pub(crate) fn acquire_share_first(&self, ask: &ShareAsk<'_, '_>) -> String {
        let (t, h) = (&self.table, &self.side);
        let (l, share, lease_ms, want_ms) = (ask.lock, ask.share, ask.lease_ms, ask.want_ms);
        let [tok, own, floor, ceil] = ask.values();
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
             INSERT INTO {h} (region, lock_key, token, kind, permits, expires_ms, fence, owner)
             SELECT m.region, m.lock_key, {tok}, '{code}', {permits}, {ceil} + {lease_ms},
                    GREATEST(m.fence + 1, {MY_US}), {own}
             FROM {t} m
             WHERE {mw} AND (
                 EXISTS (SELECT 1 FROM {h} x WHERE {live} AND x.token = {tok} AND x.kind = '{code}')
                 OR ((m.token IS NULL OR m.expires_ms <= {floor} OR m.token = '{mark}')
                     AND NOT EXISTS (SELECT 1 FROM {h} x WHERE {live} AND x.token <> {tok}
                                       AND {keeps_out})
                     AND {room}))
             ON DUPLICATE KEY UPDATE kind = VALUES(kind), permits = VALUES(permits),
                 expires_ms = VALUES(expires_ms), fence = VALUES(fence), owner = VALUES(owner);
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
}
