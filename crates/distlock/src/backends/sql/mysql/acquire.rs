//! Acquisition: one attempt at an exclusive hold (with the doorbell when the lock is
//! contended), a read hold or a permit, a waiting writer's place, and the key names that
//! Spring mode records for `list`.
use std::time::Duration;

use super::doorbell::{HEAD_GRACE_MS, IN_LINE_AHEAD};
use super::driver::{classify, int, Class};
use super::session::{Failed, Ring};
use super::state::{MySql, KIND};
use super::statement;
use crate::backend::{Attempt, LockName, Token};
use crate::backends::sql::dialect::{My, MyLock, MyOutcome, MyShareOutcome, ShareAsk};
use crate::backends::sql::kinds::{disagreement, share_owner, Share};
use crate::backends::sql::lease_table::{Engine, Take};
use crate::backends::sql::{fence_from, lease_ms, millis, WANT_WINDOW_MS};
use crate::error::{Error, Result};

impl MySql {
    /// The statement that records the key name of `name`'s row `(a, b)` (Spring mode, once
    /// per key and backend) so that `list` can show the key, if it is still to be recorded.
    fn name_to_record(&self, name: &LockName, a: &str, b: &str) -> Option<String> {
        let fresh = self.common.options.spring && self.common.name_unrecorded(a, b);
        fresh.then(|| {
            self.sql.name_key(
                &MyLock {
                    region: a,
                    key: b,
                    token: "",
                    described: "",
                },
                name.key(),
            )
        })
    }

    /// A read hold or a permit: one transaction in one round trip (see `My::acquire_share`).
    /// A reader first tries the key's row alone (`My::acquire_lone_prepared`).
    pub(super) async fn take_shared(&self, take: Take<'_>, share: Share) -> Result<Attempt> {
        let (name, token) = (take.name, take.token);
        let (a, b) = self.row_key(name)?;
        let owner = share_owner(name, token);
        let lock = MyLock {
            region: &a,
            key: &b,
            token: &owner,
            described: take.described,
        };
        let (lease, want) = (lease_ms(take.lease), WANT_WINDOW_MS);
        let unreported =
            || Error::backend(KIND, "the server did not report the acquisition's outcome");
        let mut outcome = None;
        if share.is_read() {
            let out = self
                .run_prepared("try_acquire", &self.acquire_lone, &lock, lease, true)
                .await?;
            if out.affected > 0 {
                let fence = out.last_insert_id.and_then(|f| i64::try_from(f).ok());
                outcome = Some(MyShareOutcome::Acquired {
                    fence: fence.ok_or_else(unreported)?,
                });
            }
        }
        let ask = ShareAsk {
            lock: &lock,
            share,
            lease_ms: lease,
            want_ms: want,
        };
        let outcome = match outcome {
            Some(o) => o,
            None => {
                let sql = self.sql.acquire_share(&ask);
                let out = self.run_transaction("try_acquire", &sql, true).await?;
                match statement(&out, My::share_outcome_at(share)) {
                    (0, _) => {
                        // The key's first use: the transaction that creates its row.
                        let sql = self.sql.acquire_share_first(&ask);
                        let out = self.run_transaction("try_acquire", &sql, true).await?;
                        let Some(row) = out.rows.first() else {
                            return Err(Error::backend(
                                KIND,
                                "the acquisition returned no outcome",
                            ));
                        };
                        match (int(row, 0), int(row, 1)) {
                            (Some(fence), _) => MyShareOutcome::Acquired { fence },
                            (None, Some(permits)) => MyShareOutcome::Disagree { permits },
                            _ => MyShareOutcome::Busy {
                                remaining_ms: int(row, 2).unwrap_or(0),
                            },
                        }
                    }
                    (_, v) => v.and_then(MyShareOutcome::decode).ok_or_else(unreported)?,
                }
            }
        };
        match outcome {
            MyShareOutcome::Acquired { fence } => {
                // The process holds the lock: its doorbell listener lets the next process watch.
                self.doorbells.acquired(&self.doorbell(&a, &b));
                Ok(Attempt::Acquired {
                    fence: fence_from(KIND, fence)?,
                })
            }
            MyShareOutcome::Disagree { permits } if !share.is_read() => {
                Err(disagreement(name, permits))
            }
            MyShareOutcome::Disagree { .. } => Ok(self.busy(&a, &b, take.queued, None)),
            MyShareOutcome::Busy { remaining_ms } => {
                Ok(self.busy(&a, &b, take.queued, Some(millis(remaining_ms))))
            }
        }
    }

    /// A busy outcome of an attempt at the lock of row `(a, b)`: the listener that woke the
    /// waiter for it looks again, and a waiter that the listener watches for polls only at
    /// the safety pace (see [`IN_LINE_AHEAD`]).
    fn busy(&self, a: &str, b: &str, queued: bool, retry_after: Option<Duration>) -> Attempt {
        let doorbell = self.doorbell(a, b);
        self.doorbells.tried(&doorbell);
        let watched = queued && self.doorbells.watched(&doorbell);
        Attempt::Busy {
            retry_after,
            ahead: watched.then_some(IN_LINE_AHEAD),
        }
    }

    /// After an exclusive attempt: a waiting writer that found readers in takes (or renews)
    /// its place; one that acquired gives its place back.
    async fn writer_place(&self, lock: &MyLock<'_>, token: Token, acquired: bool) {
        let waiter = token.to_string();
        let lock = MyLock {
            token: &waiter,
            ..lock.clone()
        };
        if acquired {
            if self.common.writers.take(token) {
                let _ = self.run("leave_queue", &self.sql.leave(&lock), true).await;
            }
            return;
        }
        match self
            .run("try_acquire", &self.sql.writer_place(&lock), true)
            .await
        {
            Ok(out) if out.affected > 0 => self.common.writers.taken(token),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "the waiting writer's place was not taken"),
        }
    }
}

impl MySql {
    /// One attempt at an exclusive hold; an acquisition of a lock contended lately takes the
    /// doorbell in the same round trip.
    pub(super) async fn take_exclusive(&self, take: Take<'_>) -> Result<Attempt> {
        let (name, token) = (take.name, take.token);
        let (a, b) = self.row_key(name)?;
        let owner = self.owner(name, token);
        let lock = MyLock {
            region: &a,
            key: &b,
            token: &owner,
            described: take.described,
        };
        let doorbell = self.doorbell(&a, &b);
        let mut outcome = None;
        let mut armed = false;
        if self.common.options.native() {
            // Behind another process in the lock's queue: leave a free lock to it for a
            // while (it is being woken), which keeps the handoff first come, first served
            // even when this waiter's polling comes first.
            let defer = take.queued && self.doorbells.behind(&doorbell);
            let mut rung = None;
            if self.doorbells.recently_contended(&doorbell) {
                // Take the doorbell in the same round trip, on the session that will give
                // it back with the release. Also for a try: a waiter woken in its turn tries
                // (its last acquisition did not wait), and a doorbell taken by a statement of
                // its own would cost the hand-over a round trip ahead of the release and leave
                // the next waiter's listener a held lock without a doorbell to wait on.
                if let Some(sql) = self.sql.acquire_existing(
                    &lock,
                    lease_ms(take.lease),
                    WANT_WINDOW_MS,
                    defer.then_some(HEAD_GRACE_MS),
                ) {
                    match self
                        .doorbells
                        .exec(&doorbell, sql, Ring::ArmIfAcquired)
                        .await
                    {
                        Ok(e) => {
                            armed = true;
                            rung = Some(e);
                        }
                        Err(Failed { error, .. })
                            if !matches!(classify(&error), Class::Permanent) =>
                        {
                            // The statement is idempotent for the same token: try it
                            // again without the doorbell, with the usual retries.
                            tracing::debug!(%error, "acquisition with the doorbell failed; again without");
                        }
                        Err(Failed { error, .. }) => return Err(self.error("try_acquire", &error)),
                    }
                }
            }
            let out = match rung {
                Some(out) => out,
                None => {
                    let p = if defer {
                        &self.acquire_deferring
                    } else {
                        &self.acquire_prepared
                    };
                    self.run_prepared("try_acquire", p, &lock, lease_ms(take.lease), true)
                        .await?
                }
            };
            if out.affected > 0 {
                outcome = out.last_insert_id.and_then(MyOutcome::decode);
                if outcome.is_none() {
                    return Err(Error::backend(
                        KIND,
                        "the server did not report the acquisition's outcome",
                    ));
                }
            }
        }
        let outcome = match outcome {
            Some(o) => o,
            None => {
                // First use of the key (no row yet), or the Spring layout (whose key name
                // goes along, the first time, for `list`).
                let mut sql = self
                    .sql
                    .acquire(&lock, lease_ms(take.lease), WANT_WINDOW_MS);
                let named = self.name_to_record(name, &a, &b);
                if let Some(n) = &named {
                    sql = format!("{n};\n{sql}");
                }
                let out = self.run("try_acquire", &sql, true).await?;
                if named.is_some() {
                    self.common.name_recorded(&a, &b);
                }
                let Some(row) = out.rows.first() else {
                    return Ok(self.busy(&a, &b, take.queued, None));
                };
                if int(row, 0).unwrap_or(0) > 0 {
                    MyOutcome::Acquired {
                        fence: int(row, 1).unwrap_or(0),
                        // A new row was wanted by nobody; Spring's table cannot say.
                        wanted: !self.common.options.native(),
                    }
                } else {
                    MyOutcome::Busy {
                        remaining_ms: int(row, 2).unwrap_or(0),
                        read_shared: int(row, 3).unwrap_or(0) > 0,
                    }
                }
            }
        };
        let (fence, wanted) = match outcome {
            MyOutcome::Acquired { fence, wanted } => (fence, wanted),
            MyOutcome::Busy {
                remaining_ms,
                read_shared,
            } => {
                self.doorbells.note_contended(&doorbell);
                if take.queued && read_shared {
                    // A waiting writer keeps new readers out.
                    self.writer_place(&lock, token, false).await;
                }
                return Ok(self.busy(&a, &b, take.queued, Some(millis(remaining_ms))));
            }
        };
        if self.common.writers.has(token) {
            self.writer_place(&lock, token, true).await;
        }
        // Ring the doorbell for waiters when there are (or lately were) any; a waiter that
        // comes later finds it silent and looks at the row now and then instead. Armed
        // within the attempt, so that the undo's release (if the caller went away) gives
        // the doorbell back after this takes it.
        self.doorbells.acquired(&doorbell);
        if wanted {
            self.doorbells.note_contended(&doorbell);
            if !armed {
                self.doorbells.arm(doorbell);
            }
        }
        Ok(Attempt::Acquired {
            fence: fence_from(KIND, fence)?,
        })
    }
}
