//! When the leases of the HTTP holds end: one schedule and one task for all holds, rather than
//! a task per hold (a spawned task, its first poll and its abort at release cost more than the
//! rest of a short hold's bookkeeping).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

/// A hold's token as the hold table and this schedule key it: its 128 bits.
pub type TokenBits = u128;

/// Where a hold is in the schedule: its lease's end and its id (the board's).
pub type Slot = (Instant, u64);

/// The holds by the end of their leases. Cheap to clone.
#[derive(Clone, Default)]
pub struct Expiries {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    schedule: Mutex<Schedule>,
    /// Wakes the task for a hold due before the time it will look next.
    wake: Notify,
}

#[derive(Default)]
struct Schedule {
    due: BTreeMap<Slot, TokenBits>,
    /// When the task will look next; `None`: only when woken. It may be the end of a hold
    /// released since: the task then looks once for nothing, but a hold scheduled later
    /// (leases of one length end in the order they began) need not wake it, which a task
    /// that went to sleep whenever the schedule emptied would need for nearly every hold.
    looks_at: Option<Instant>,
}

impl Expiries {
    fn schedule_mut(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.inner
            .schedule
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Schedules the hold `id` (token `token`) for `at`; returns its slot.
    pub fn schedule(&self, at: Instant, id: u64, token: TokenBits) -> Slot {
        let slot = (at, id);
        let mut schedule = self.schedule_mut();
        schedule.due.insert(slot, token);
        if schedule.looks_at.is_none_or(|t| at < t) {
            schedule.looks_at = Some(at);
            drop(schedule);
            self.inner.wake.notify_one();
        }
        slot
    }

    /// Takes a hold out of the schedule (released, or moved to another time).
    pub fn unschedule(&self, slot: Slot) {
        self.schedule_mut().due.remove(&slot);
    }

    /// Waits for the next holds due and returns their tokens, out of the schedule.
    ///
    /// # Cancel safety
    /// Cancel safe: entries are taken out only when it returns.
    pub async fn next_due(&self) -> Vec<TokenBits> {
        loop {
            // Made before looking, so that a wake-up meanwhile is not missed.
            let woken = self.inner.wake.notified();
            let now = Instant::now();
            let next = {
                let mut schedule = self.schedule_mut();
                let next = match schedule.due.first_key_value().map(|(s, _)| s.0) {
                    Some(at) if at <= now => {
                        schedule.looks_at = None;
                        let later = schedule.due.split_off(&(now, u64::MAX));
                        let ready = std::mem::replace(&mut schedule.due, later);
                        return ready.into_values().collect();
                    }
                    Some(at) => Some(at),
                    None => schedule.looks_at.filter(|t| *t > now),
                };
                schedule.looks_at = next;
                next
            };
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = woken => {}
                    }
                }
                None => woken.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn an_earlier_hold_wakes_the_waiting_task_and_unscheduled_ones_never_come() {
        let expiries = Expiries::default();
        let t0 = Instant::now();
        let late = expiries.schedule(t0 + Duration::from_secs(60), 2, 60);
        let gone = expiries.schedule(t0 + Duration::from_millis(1), 3, 61);
        expiries.unschedule(gone);
        let task = tokio::spawn({
            let expiries = expiries.clone();
            async move { expiries.next_due().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Scheduled while the task sleeps until the late one: it must wake for this one.
        expiries.schedule(Instant::now() + Duration::from_millis(50), 1, 62);
        let due = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("woken for the earlier hold")
            .unwrap();
        assert_eq!(due, [62]);
        assert_eq!(expiries.schedule_mut().due.len(), 1);
        expiries.unschedule(late);
        assert!(expiries.schedule_mut().due.is_empty());
    }
}
