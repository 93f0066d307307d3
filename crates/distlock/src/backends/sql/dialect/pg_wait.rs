//! PostgreSQL's wait table (`<table>_waits`): the exclusive waiters of each key in the order
//! they came, so that a release wakes the next one alone. `NOTIFY` reaches every connection
//! that listens on its channel: a release that notified the table's channel woke every waiting
//! registry, and each made an attempt (about W − 1 futile attempts per hand-over). With the wait
//! table the release takes the oldest live entry out in the same statement and notifies that
//! waiter's registry on a channel of its own, the entry's waiter in the payload.
//!
//! The entries only say whom to wake; the lease table alone decides who holds a key. A release
//! that finds no live entry (no waiter registered, a foreign client's, entries expired) notifies
//! the table's channel as before, and the registries' polling stays the fallback: an entry whose
//! waiter died is taken out by the next release, which then wakes nobody, so the others wait
//! for their next poll once.

use super::pg_text::{pg_table, PG_MS_CEIL, PG_MS_FLOOR, PG_US};
use crate::backends::sql::kinds::waits_table;

/// How long a waiter's entry stands unless its waiter renews it (see `postgres::wait`); an
/// entry nobody took out or renewed is skipped once it expired and removed by the key's next
/// registration.
pub(crate) const WAIT_ENTRY_MS: i64 = 5000;

/// The statements of the wait table; the columns `row_a`, `row_b` are the key's row as the
/// layout's `$1`, `$2` name it.
#[derive(Debug, Clone, Default)]
pub(crate) struct PgWaits {
    /// `$1`, `$2` the row, `$3` the waiter (its owner value), `$4` its registry's origin,
    /// `$5` its place (NULL for a new one: the server's clock in µs), `$6` the entry's life in
    /// ms. Takes or renews the place and drops the key's expired entries; returns (place,
    /// alone): alone when no live entry of another waiter is before it.
    pub(crate) register: String,
    /// `$1`, `$2` the row, `$3` the waiter, `$4` its place: a waiter that stopped waiting.
    pub(crate) unregister: String,
    /// The layout's release (same parameters and results) that also takes the oldest live
    /// entry of another waiter out and notifies its registry's channel (`$4` + `_` + origin)
    /// with the waiter as payload; the table's channel only when it found none.
    pub(crate) release_next: String,
    /// [`release_next`](Self::release_next) of a Spring table without its owners table.
    pub(crate) release_next_undescribed: Option<String>,
    /// `$1`, `$2` the row, `$3` the waiter's owner value: a look at the row that takes no lock
    /// and writes nothing, for the polls of a waiter whose entry stands. Returns (ours,
    /// remaining ms, readers hold it) when the key is held.
    pub(crate) peek: String,
}

/// The wait table of the layout table `table`: what [`Pg`](super::Pg)'s `with_waits` adds to a
/// layout's statements.
pub(super) struct WaitTable {
    /// The table's name as statements write it.
    pub(super) name: String,
    /// Its creation.
    pub(super) create: String,
    /// Its statements.
    pub(super) waits: PgWaits,
}

impl WaitTable {
    /// The wait table of `table`, with the release that wakes the next waiter made of `rel`
    /// (and `rel_undescribed`, see [`PgWaits::release_next_undescribed`]): the layout's release
    /// as common table expressions, the last named `rel` with the columns (contended, bell):
    /// bell when a release without a waiter's entry notifies the table's channel. `peek`: see
    /// [`PgWaits::peek`].
    pub(super) fn new(
        schema: Option<&str>,
        table: &str,
        (rel, rel_undescribed): (&str, Option<&str>),
        peek: String,
    ) -> WaitTable {
        let w = pg_table(schema, &waits_table(table));
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {w} (
                row_a TEXT NOT NULL,
                row_b TEXT NOT NULL,
                seq BIGINT NOT NULL,
                waiter TEXT NOT NULL,
                origin TEXT NOT NULL,
                expires_ms BIGINT NOT NULL,
                PRIMARY KEY (row_a, row_b, seq, waiter)
            )"
        );
        let (floor, ceil) = (PG_MS_FLOOR, PG_MS_CEIL);
        let waits = PgWaits {
            register: format!(
                "WITH prune AS (
                     DELETE FROM {w}
                     WHERE row_a = $1::text AND row_b = $2::text AND expires_ms <= {floor}
                       AND (waiter <> $3::text OR $5::bigint IS NULL OR seq <> $5::bigint)
                 )
                 INSERT INTO {w} AS x (row_a, row_b, seq, waiter, origin, expires_ms)
                 VALUES ($1::text, $2::text, COALESCE($5::bigint, {PG_US}), $3::text, $4::text,
                         {ceil} + $6::bigint)
                 ON CONFLICT (row_a, row_b, seq, waiter)
                     DO UPDATE SET expires_ms = excluded.expires_ms, origin = excluded.origin
                 RETURNING x.seq, NOT EXISTS (
                     SELECT 1 FROM {w} o
                     WHERE o.row_a = $1::text AND o.row_b = $2::text AND o.expires_ms > {floor}
                       AND o.waiter <> $3::text AND (o.seq, o.waiter) < (x.seq, x.waiter)
                 )"
            ),
            unregister: format!(
                "DELETE FROM {w}
                 WHERE row_a = $1::text AND row_b = $2::text AND seq = $4::bigint
                   AND waiter = $3::text"
            ),
            release_next: release_next(&w, rel),
            release_next_undescribed: rel_undescribed.map(|r| release_next(&w, r)),
            peek,
        };
        WaitTable {
            name: w,
            create,
            waits,
        }
    }
}

/// `rel` (see [`WaitTable::new`]) followed by the hand-over to the oldest live entry of another
/// waiter of the key. `SKIP LOCKED`: two releases at once (one of them of an expired hold) do
/// not wait for each other's entry.
fn release_next(w: &str, rel: &str) -> String {
    let floor = PG_MS_FLOOR;
    format!(
        "WITH {rel}, nxt AS (
             SELECT seq, waiter FROM {w}
             WHERE row_a = $1::text AND row_b = $2::text AND expires_ms > {floor}
               AND waiter <> $3::text AND EXISTS (SELECT 1 FROM rel)
             ORDER BY seq, waiter LIMIT 1 FOR UPDATE SKIP LOCKED
         ), pop AS (
             DELETE FROM {w} x USING nxt
             WHERE x.row_a = $1::text AND x.row_b = $2::text AND x.seq = nxt.seq
               AND x.waiter = nxt.waiter
             RETURNING x.waiter, x.origin
         )
         SELECT rel.contended OR EXISTS (SELECT 1 FROM pop),
                CASE WHEN EXISTS (SELECT 1 FROM pop)
                     THEN (SELECT pg_notify($4::text || '_' || pop.origin, pop.waiter)::text FROM pop)
                     WHEN rel.bell THEN pg_notify($4, $5)::text END
         FROM rel"
    )
}
