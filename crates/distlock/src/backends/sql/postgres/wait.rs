//! This backend's entries in the wait table (see `dialect::pg_wait`): a waiter for a mutex or a
//! write lock takes a place when it subscribes, renews it while it waits, takes it again when a
//! release woke it but somebody else was faster, and gives it back when it stops waiting
//! without having been woken (the subscription's end). The listener wakes a waiter whose entry
//! a release took out (`listen.rs`).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::places::Entry;
use super::pool::Stmt;
use super::state::Postgres;
use crate::backend::{Attempt, LockName, ReleaseSignal, ReleaseSubscription, Token};
use crate::backends::sql::dialect::WAIT_ENTRY_MS;
use crate::backends::sql::kinds::{place, Place};
use crate::backends::sql::lease_table::Engine;
use crate::backends::sql::millis;

/// A waiting attempt renews its entry once this much of the entry's life has passed (the
/// registry attempts at least every `max_poll_interval` while it waits, 500 ms by default).
const RENEW_AFTER: Duration = Duration::from_millis(WAIT_ENTRY_MS as u64 * 2 / 5);

/// Most waiters a backend keeps entries for; past it, new waiters take none (and are woken by
/// the table's channel or their polls, as without the wait table).
const MAX_ENTRIES: usize = 100_000;

/// How long after taking the first place in line a waiter looks whether the key is free
/// (see [`Postgres::wait_in_line`]): far longer than a woken waiter takes to acquire on a
/// machine that is not overloaded, far shorter than a registry's yield after its release.
const RECHECK_ALONE: Duration = Duration::from_millis(2);

/// The channel of [`ReleaseSignals`](crate::backend::ReleaseSignals) that wakes one waiter.
pub(super) fn waiter_channel(waiter: &str) -> String {
    format!("waiter/{waiter}")
}

impl Postgres {
    /// Takes a place in the wait table for the waiter `token` of `name` and returns the
    /// subscription to its own wake-up; `None` for the kinds that share (their waiters are all
    /// woken by the table's channel) and without the wait table. The place goes with the
    /// subscription.
    pub(super) async fn wait_in_line(
        self: &Arc<Self>,
        name: &LockName,
        token: Token,
    ) -> Option<ReleaseSubscription> {
        if !self.waits.ready.load(std::sync::atomic::Ordering::Acquire)
            || !matches!(place(name), Place::Row)
        {
            return None;
        }
        let row = self.ident(name).ok()?;
        let waiter = self.owner(name, token);
        {
            let mut entries = self.waits.entries();
            if entries.len() >= MAX_ENTRIES || entries.contains_key(&waiter) {
                return None;
            }
            entries.insert(
                waiter.clone(),
                Entry {
                    row,
                    seq: None,
                    renewed: Instant::now(),
                    taken: false,
                },
            );
        }
        let sub = self
            .common
            .signals
            .subscribe_transient(&waiter_channel(&waiter));
        let leaving = Leaving {
            engine: Arc::downgrade(self),
            waiter: waiter.clone(),
        };
        let sub = sub.merge(ReleaseSubscription::new(
            Arc::new(ReleaseSignal::default()),
            Some(Box::new(leaving)),
        ));
        if self.take_place(&waiter).await {
            // Nobody was in line before this waiter: the key's last release may have found no
            // entry and rung the table's channel before this subscription listened (its
            // registry was still on its way back from its own release, say). Nobody would wake
            // it then until its next poll, the whole yield of a registry that just released.
            // A look a little later, once a waiter woken by that release (whose entry is gone)
            // had time to take the key, tells.
            let (engine, waiter) = (Arc::downgrade(self), waiter.clone());
            tokio::spawn(async move {
                tokio::time::sleep(RECHECK_ALONE).await;
                if let Some(engine) = engine.upgrade() {
                    engine.recheck(&waiter).await;
                }
            });
        }
        Some(sub)
    }

    /// A waiter that was first in line when it took its place, and still waits with its entry
    /// standing: wakes it if nobody holds the key (see [`wait_in_line`](Self::wait_in_line)).
    async fn recheck(&self, waiter: &str) {
        let row = {
            let entries = self.waits.entries();
            match entries.get(waiter) {
                Some(e) if e.seq.is_some() && !e.taken => e.row.clone(),
                _ => return,
            }
        };
        let (a, b) = (&row.0, &row.1);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [a, b, &waiter];
        if let Ok(rows) = self.query("wait", Stmt::Peek, &params, true).await {
            if rows.is_empty() {
                tracing::trace!(target: "distlock::probe", ev = "recheck_free");
                self.common.signals.fire(&waiter_channel(waiter));
            }
        }
    }

    /// After an exclusive attempt of `token`. Busy: takes its place again if a release took it
    /// out, or renews it when due. Acquired with its entry still in the table (it was not
    /// woken by its entry, but by its poll or the table's channel): gives the entry back before
    /// the caller learns that it holds the key, since a release that found the entry would wake
    /// a waiter that waits no more.
    pub(super) async fn after_attempt(&self, name: &LockName, token: Token, acquired: bool) {
        let waiter = self.owner(name, token);
        let (due, placed) = {
            let mut entries = self.waits.entries();
            let Some(e) = entries.get_mut(&waiter) else {
                return;
            };
            if acquired {
                let placed = e.seq.filter(|_| !e.taken).map(|s| (e.row.clone(), s));
                // Given back here; the subscription's end has nothing left to do.
                (e.seq, e.taken) = (None, false);
                (false, placed)
            } else {
                let due = e.taken || e.seq.is_none() || e.renewed.elapsed() >= RENEW_AFTER;
                (due, None)
            }
        };
        if let Some(((a, b), seq)) = placed {
            self.leave_line(&a, &b, &waiter, seq).await;
        } else if due {
            self.take_place(&waiter).await;
        }
    }

    /// The poll of a waiter whose entry stands (nobody woke it): a look at the row `(a, b)`,
    /// which locks and writes nothing, answers while an exclusive holder's lease runs. A release
    /// will wake the waiter through its entry, or the one before it, and the look still finds
    /// an expired lease or a free key (a notification lost, a woken waiter that died, a
    /// foreign client's release), which the full attempt then takes. `None`: make the attempt.
    pub(super) async fn peek(&self, a: &str, b: &str, waiter: &str) -> Option<Attempt> {
        let standing = self
            .waits
            .entries()
            .get(waiter)
            .is_some_and(|e| e.seq.is_some() && !e.taken);
        if !standing {
            return None;
        }
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&a, &b, &waiter];
        tracing::trace!(target: "distlock::probe", ev = "peek");
        let rows = self.query("try_acquire", Stmt::Peek, &params, true).await;
        let rows = rows.ok()?;
        let row = rows.first()?;
        let (ours, remaining, readers): (bool, i64, bool) = (row.get(0), row.get(1), row.get(2));
        if ours || readers {
            return None;
        }
        Some(Attempt::Busy {
            retry_after: Some(millis(remaining)),
            ahead: None,
        })
    }

    /// The listener heard that a release took `waiter`'s entry out: wakes it.
    pub(super) fn woken(&self, waiter: &str) {
        if let Some(e) = self.waits.entries().get_mut(waiter) {
            e.taken = true;
        }
        self.common.signals.fire(&waiter_channel(waiter));
    }

    /// Takes (or renews) `waiter`'s place. A failure leaves the waiter to the table's channel
    /// and its polls. Returns whether a new place was taken with nobody before it.
    async fn take_place(&self, waiter: &str) -> bool {
        let Some((a, b, seq)) = self
            .waits
            .entries()
            .get(waiter)
            .map(|e| (e.row.0.clone(), e.row.1.clone(), e.seq))
        else {
            return false;
        };
        let life = WAIT_ENTRY_MS;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [&a, &b, &waiter, &self.origin, &seq, &life];
        // A new place is not taken twice (a retry would take a second one).
        let again = seq.is_some();
        tracing::trace!(target: "distlock::probe", ev = if again { "renew_place" } else { "take_place" });
        let placed: Option<(i64, bool)> =
            match self.query("wait", Stmt::Register, &params, again).await {
                Ok(rows) => rows.first().map(|r| (r.get(0), r.get(1))),
                Err(e) => {
                    tracing::debug!(error = %e, "no place in the wait table; woken by the channel");
                    None
                }
            };
        let Some((placed, alone)) = placed else {
            return false;
        };
        let gone = {
            let mut entries = self.waits.entries();
            match entries.get_mut(waiter) {
                Some(e) => {
                    (e.seq, e.renewed, e.taken) = (Some(placed), Instant::now(), false);
                    false
                }
                None => true,
            }
        };
        if gone {
            // The waiter stopped while its place was being taken: give it back.
            self.leave_line(&a, &b, waiter, placed).await;
        }
        alone && !again && !gone
    }

    async fn leave_line(&self, a: &str, b: &str, waiter: &str, seq: i64) {
        tracing::trace!(target: "distlock::probe", ev = "leave_line");
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&a, &b, &waiter, &seq];
        if let Err(e) = self.query("wait", Stmt::Unregister, &params, true).await {
            tracing::debug!(error = %e, "the wait table's entry stays until it expires");
        }
    }
}

/// Part of a waiter's subscription: when it goes, the waiter stopped waiting (it acquired,
/// gave up or was dropped), and an entry still in the table is given back, in the background.
struct Leaving {
    engine: Weak<Postgres>,
    waiter: String,
}

impl Drop for Leaving {
    fn drop(&mut self) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let Some(entry) = engine.waits.entries().remove(&self.waiter) else {
            return;
        };
        let (Some(seq), false) = (entry.seq, entry.taken) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let waiter = std::mem::take(&mut self.waiter);
        rt.spawn(async move {
            let (a, b) = &entry.row;
            engine.leave_line(a, b, &waiter, seq).await;
        });
    }
}
