//! One renewal task per registry: keeps every remote hold's lease alive at about a third of the
//! lease, in batches, and marks holds lost when the backend denies them or their lease runs out.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Backend, LockName, Renewal, Token};

/// Bits of a fence reserved for local handoffs within one remote hold (lock cohorting).
pub(crate) const LOCAL_SEQ_BITS: u32 = 10;

/// The composite fence: the backend's fence in the high bits, the local handoff number below.
pub(crate) fn compose_fence(backend_fence: u64, local_seq: u32) -> u64 {
    backend_fence.saturating_mul(1 << LOCAL_SEQ_BITS) | u64::from(local_seq)
}

#[derive(Debug, Clone, Copy)]
struct Times {
    lease: Duration,
    /// Until when the server keeps the lease for sure: measured from before the request that
    /// set it was sent, so the client errs on the early side.
    valid_until: Instant,
    next_renewal: Instant,
}

/// One remote acquisition (one owner token), possibly passed between several local guards.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) id: u64,
    pub(crate) name: LockName,
    pub(crate) token: Token,
    pub(crate) backend_fence: u64,
    /// The backend's kind, for metrics.
    backend: &'static str,
    pub(crate) local_seq: AtomicU32,
    times: Mutex<Times>,
    lost: AtomicBool,
    released: AtomicBool,
    lost_notify: Notify,
}

static NEXT_HOLD_ID: AtomicU64 = AtomicU64::new(1);

impl Hold {
    pub(crate) fn new(
        backend: &'static str,
        name: LockName,
        token: Token,
        backend_fence: u64,
        lease: Duration,
        sent: Instant,
    ) -> Self {
        Hold {
            id: NEXT_HOLD_ID.fetch_add(1, Ordering::Relaxed),
            name,
            token,
            backend_fence,
            backend,
            local_seq: AtomicU32::new(0),
            times: Mutex::new(Times {
                lease,
                valid_until: sent + lease,
                next_renewal: sent + lease / 3,
            }),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
            lost_notify: Notify::new(),
        }
    }

    fn times(&self) -> Times {
        *self.times.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lease(&self) -> Duration {
        self.times().lease
    }

    /// When the lease ends as far as the client can tell (it counts from before the request
    /// that set it, so this is never after the server's end).
    pub(crate) fn valid_until(&self) -> Instant {
        self.times().valid_until
    }

    /// The lease left as far as the client can tell (zero once lost).
    pub(crate) fn remaining(&self) -> Duration {
        if self.lost.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        self.times()
            .valid_until
            .saturating_duration_since(Instant::now())
    }

    /// True while the hold is neither lost nor past its lease.
    pub(crate) fn is_held(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return false;
        }
        if Instant::now() >= self.times().valid_until {
            self.mark_lost("lease ran out before a renewal confirmed it");
            return false;
        }
        true
    }

    /// Records a confirmed extension sent at `sent` with `lease`.
    pub(crate) fn confirm(&self, sent: Instant, lease: Duration) {
        let mut t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        t.lease = lease;
        t.valid_until = sent + lease;
        t.next_renewal = sent + lease / 3;
    }

    fn retry_renewal_at(&self, at: Instant) {
        let mut t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        t.next_renewal = at.min(t.valid_until);
    }

    pub(crate) fn mark_lost(&self, why: &str) {
        if self.released.load(Ordering::Acquire) {
            return;
        }
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::warn!(lock = ?self.name, fence = self.backend_fence, "lock lost: {why}");
            crate::metrics::lost(self.backend);
            self.lost_notify.notify_waiters();
        }
    }

    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::Release);
    }

    /// Completes once the hold is lost (denied by the backend, or its lease ran out).
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.is_held() {
                return;
            }
            let until = self.times().valid_until;
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

/// The per-registry renewal task's shared state.
#[derive(Debug)]
pub(crate) struct Renewer {
    backend: Arc<dyn Backend>,
    renew: bool,
    schedule: Mutex<Schedule>,
    wake: Arc<Notify>,
    /// Alive while the renewal task exists. The task lives on the runtime of the hold that
    /// started it and dies with that runtime; the next registration then starts it anew on its
    /// own runtime.
    task: Mutex<Weak<()>>,
    /// When the task will look next (µs since `epoch`, rounded up); a new hold due earlier
    /// lowers it, and wakes the task unless a pass is running (the task reads it after the pass).
    next_pass_us: AtomicU64,
    passing: AtomicBool,
    epoch: Instant,
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Renewer {
    pub(crate) fn new(backend: Arc<dyn Backend>, renew: bool) -> Self {
        Renewer {
            backend,
            renew,
            schedule: Mutex::new(Schedule::default()),
            wake: Arc::new(Notify::new()),
            task: Mutex::new(Weak::new()),
            next_pass_us: AtomicU64::new(u64::MAX),
            passing: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }

    /// Starts watching `hold`: renewing it (when renewal is on) and marking it lost when its
    /// lease runs out unconfirmed. Needs a Tokio runtime (the caller runs in one): if the
    /// renewal task is not running (first hold, or its runtime was shut down since), it is
    /// started on the caller's.
    pub(crate) fn register(self: &Arc<Self>, hold: Arc<Hold>) {
        let due = self.us_since_epoch(self.due(&hold));
        let id = hold.id;
        let mut schedule = self.schedule();
        schedule.holds.insert(id, Watched { hold, queued: due });
        schedule.queue.push(Reverse((due, id)));
        drop(schedule);
        let started = self.ensure_task();
        self.wake_for(due, started);
    }

    /// Takes a hold's new times into account (an extension with another lease may make it due
    /// before the task's next look).
    pub(crate) fn rescheduled(&self, hold: &Hold) {
        let due = self.us_since_epoch(self.due(hold));
        let mut schedule = self.schedule();
        // A later time needs nothing: the hold's entry comes up early and is put back.
        if !schedule.requeue_if_earlier(hold.id, due) {
            return;
        }
        drop(schedule);
        self.wake_for(due, false);
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn due(&self, hold: &Hold) -> Instant {
        let t = hold.times();
        if self.renew {
            t.next_renewal
        } else {
            t.valid_until
        }
    }

    /// Wakes the task for a hold due at `due` (µs since `epoch`) if it would look later.
    fn wake_for(&self, due: u64, started: bool) {
        // Waking the task costs a task switch per acquisition; only do it when the new hold is
        // due before the task's next look, and no pass is running: that one takes the lowered
        // time into account when it ends (see `run`).
        let planned = self.next_pass_us.fetch_min(due, Ordering::SeqCst);
        if !started && due < planned && !self.passing.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Starts the renewal task on the caller's runtime unless it is alive. Returns whether it
    /// started it (a new task makes a pass at once, so it needs no wake-up).
    fn ensure_task(self: &Arc<Self>) -> bool {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.strong_count() > 0 {
            return false;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let alive = Arc::new(());
        *task = Arc::downgrade(&alive);
        // A task of a runtime that shut down left its last look behind (and may have died
        // mid-pass): forget it.
        self.next_pass_us.store(u64::MAX, Ordering::SeqCst);
        self.passing.store(false, Ordering::SeqCst);
        let (weak, wake) = (Arc::downgrade(self), self.wake.clone());
        rt.spawn(run(weak, wake, alive).instrument(tracing::debug_span!("distlock.renewal")));
        true
    }

    /// Rounded up, so that the task never wakes before what is due.
    fn us_since_epoch(&self, at: Instant) -> u64 {
        let ns = at.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(ns.div_ceil(1000)).unwrap_or(u64::MAX)
    }

    fn instant_of_us(&self, us: u64) -> Instant {
        self.epoch + Duration::from_micros(us)
    }

    pub(crate) fn deregister(&self, hold: &Hold) {
        hold.mark_released();
        let mut schedule = self.schedule();
        schedule.holds.remove(&hold.id);
        schedule.compact();
    }

    /// One pass: renews what is due, marks what expired; returns when to look again. It
    /// touches only the holds that come up in the schedule, not every hold.
    async fn pass(&self) -> Instant {
        let now = Instant::now();
        // Renew a little early (a tenth of the lease, at most a second) so that holds due close
        // together share one batch.
        let horizon = self.us_since_epoch(if self.renew {
            now + Duration::from_secs(1)
        } else {
            now
        });
        let mut due = Vec::new();
        {
            let mut schedule = self.schedule();
            let mut later = Vec::new();
            while let Some(hold) = schedule.pop_until(horizon) {
                if !hold.is_held() {
                    schedule.holds.remove(&hold.id);
                    continue;
                }
                let t = hold.times();
                let slack = (t.lease / 10).min(Duration::from_secs(1));
                if self.renew && now + slack >= t.next_renewal {
                    // Off the queue until its batch has answered.
                    due.push(hold);
                } else {
                    later.push((self.us_since_epoch(self.due(&hold)), hold.id));
                }
            }
            for (at, id) in later {
                schedule.requeue(id, at);
            }
        }
        if due.is_empty() {
            return self.next_look(now);
        }
        let batch: Vec<Renewal> = due
            .iter()
            .map(|h| Renewal {
                name: h.name.clone(),
                token: h.token,
                lease: h.lease(),
            })
            .collect();
        // A renewal that cannot finish before the earliest lease in the batch ends is useless:
        // stop waiting for it then, so the loss is reported on time.
        let deadline = due
            .iter()
            .map(|h| h.times().valid_until)
            .min()
            .unwrap_or(now);
        let sent = Instant::now();
        let span = tracing::debug_span!("distlock.renew", locks = batch.len());
        let results = tokio::time::timeout_at(deadline, self.backend.extend_many(&batch))
            .instrument(span)
            .await;
        let after = Instant::now();
        let kind = self.backend.kind();
        let (mut ok, mut denied, mut failed) = (0, 0, 0);
        for (i, hold) in due.iter().enumerate() {
            match results.as_ref().map(|v| v.get(i)) {
                Ok(Some(Ok(true))) => {
                    ok += 1;
                    hold.confirm(sent, batch[i].lease)
                }
                Ok(Some(Ok(false))) => {
                    denied += 1;
                    hold.mark_lost("the backend no longer has it for this owner")
                }
                Ok(Some(Err(e))) => {
                    failed += 1;
                    tracing::debug!(lock = ?hold.name, error = %e, "renewal failed; retrying");
                    hold.retry_renewal_at(after + retry_delay(hold));
                }
                Ok(None) | Err(_) => {
                    failed += 1;
                    hold.retry_renewal_at(after + retry_delay(hold))
                }
            }
        }
        crate::metrics::renewals(kind, "ok", ok);
        crate::metrics::renewals(kind, "denied", denied);
        crate::metrics::renewals(kind, "error", failed);
        {
            let mut schedule = self.schedule();
            for hold in &due {
                if hold.is_held() {
                    schedule.requeue(hold.id, self.us_since_epoch(self.due(hold)));
                } else {
                    schedule.holds.remove(&hold.id);
                }
            }
        }
        self.next_look(now)
    }

    /// When the first hold in the schedule is due (at most a minute from `now`).
    fn next_look(&self, now: Instant) -> Instant {
        let latest = now + Duration::from_secs(60);
        match self.schedule().queue.peek() {
            Some(Reverse((at, _))) => self.instant_of_us(*at).min(latest),
            None => latest,
        }
    }
}

/// The holds a renewal task watches, in the order they come due.
#[derive(Debug, Default)]
struct Schedule {
    holds: HashMap<u64, Watched>,
    /// (due in µs since the renewer's epoch, hold id), earliest first. An entry is live while
    /// it matches its hold's `queued`; others are left behind by releases and rescheduling and
    /// are skipped when they come up (or dropped by `compact`).
    queue: BinaryHeap<Reverse<(u64, u64)>>,
}

#[derive(Debug)]
struct Watched {
    hold: Arc<Hold>,
    /// The due time of its live queue entry; `u64::MAX` while its renewal is in flight.
    queued: u64,
}

impl Schedule {
    /// The next hold due by `horizon`, taken off the queue (it must be requeued to be watched
    /// again).
    fn pop_until(&mut self, horizon: u64) -> Option<Arc<Hold>> {
        while let Some(&Reverse((at, id))) = self.queue.peek() {
            if at > horizon {
                return None;
            }
            self.queue.pop();
            if let Some(w) = self.holds.get_mut(&id).filter(|w| w.queued == at) {
                w.queued = u64::MAX;
                return Some(w.hold.clone());
            }
        }
        None
    }

    /// Puts a watched hold back on the queue, due at `at`; its earlier entry goes stale.
    fn requeue(&mut self, id: u64, at: u64) {
        if let Some(w) = self.holds.get_mut(&id) {
            w.queued = at;
            self.queue.push(Reverse((at, id)));
        }
    }

    /// Requeues a hold whose live entry (if any) is later than `at`. Returns whether it did.
    fn requeue_if_earlier(&mut self, id: u64, at: u64) -> bool {
        match self.holds.get(&id) {
            Some(w) if at < w.queued && w.queued != u64::MAX => {
                self.requeue(id, at);
                true
            }
            _ => false,
        }
    }

    /// Drops stale entries once they outnumber the live ones (many short holds would otherwise
    /// leave one entry each until their renewal time).
    fn compact(&mut self) {
        if self.queue.len() > 2 * self.holds.len() + 1024 {
            let holds = &self.holds;
            self.queue
                .retain(|Reverse((at, id))| holds.get(id).is_some_and(|w| w.queued == *at));
        }
    }
}

fn retry_delay(hold: &Hold) -> Duration {
    (hold.remaining() / 4).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// The renewal task. `_alive` goes when the task does, also when its runtime drops it
/// unfinished; that is how [`Renewer::ensure_task`] knows to start another.
async fn run(weak: Weak<Renewer>, wake: Arc<Notify>, _alive: Arc<()>) {
    loop {
        let Some(renewer) = weak.upgrade() else {
            return;
        };
        // While a pass runs, registrations only lower `next_pass_us` (the pass may have looked
        // at the table before their hold was in it); the earlier of that and what the pass
        // found is when to look next.
        renewer.next_pass_us.store(u64::MAX, Ordering::SeqCst);
        renewer.passing.store(true, Ordering::SeqCst);
        let found = renewer.us_since_epoch(renewer.pass().await);
        renewer.passing.store(false, Ordering::SeqCst);
        let registered = renewer.next_pass_us.fetch_min(found, Ordering::SeqCst);
        let next = renewer.instant_of_us(found.min(registered));
        drop(renewer);
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(lease: Duration) -> Arc<Hold> {
        let name = LockName::new("lock", "k").unwrap();
        Arc::new(Hold::new(
            "memory",
            name,
            Token::random(),
            1,
            lease,
            Instant::now(),
        ))
    }

    fn watched(schedule: &mut Schedule, hold: &Arc<Hold>, at: u64) {
        schedule.holds.insert(
            hold.id,
            Watched {
                hold: hold.clone(),
                queued: at,
            },
        );
        schedule.queue.push(Reverse((at, hold.id)));
    }

    #[test]
    fn the_schedule_yields_due_holds_in_order_and_skips_stale_entries() {
        let mut s = Schedule::default();
        let (a, b, c) = (
            hold(Duration::from_secs(30)),
            hold(Duration::from_secs(30)),
            hold(Duration::from_secs(30)),
        );
        watched(&mut s, &a, 30);
        watched(&mut s, &b, 10);
        watched(&mut s, &c, 20);
        // b moves later (its old entry goes stale), c is released.
        s.requeue(b.id, 40);
        s.holds.remove(&c.id);
        assert_eq!(s.pop_until(35).map(|h| h.id), Some(a.id));
        assert!(s.pop_until(35).is_none(), "b is not due before 40");
        assert!(
            !s.requeue_if_earlier(a.id, 5),
            "a is in flight: its batch requeues it"
        );
        assert_eq!(s.pop_until(40).map(|h| h.id), Some(b.id));
        assert!(s.pop_until(u64::MAX).is_none());
    }

    #[test]
    fn stale_entries_are_compacted_once_they_outnumber_live_ones() {
        let mut s = Schedule::default();
        let live = hold(Duration::from_secs(30));
        watched(&mut s, &live, 1);
        for i in 0..5000 {
            let h = hold(Duration::from_secs(30));
            watched(&mut s, &h, i);
            s.holds.remove(&h.id);
            s.compact();
        }
        assert!(s.queue.len() <= 2 * s.holds.len() + 1024 + 1);
        assert_eq!(s.pop_until(u64::MAX).map(|h| h.id), Some(live.id));
    }

    /// An extension to a lease much shorter than the one the hold was renewed for must make
    /// the renewal task look earlier than it planned, or the lock is lost.
    #[cfg(feature = "memory")]
    #[tokio::test]
    async fn a_shorter_lease_set_by_extend_is_renewed_in_time() {
        let registry = crate::LockRegistry::new(crate::backends::memory::MemoryBackend::new());
        let guard = registry.obtain("k").unwrap().lock().await.unwrap();
        let lease = Duration::from_secs(1);
        guard.extend(lease).await.unwrap();
        // Three leases: it stays held only if it is renewed at the new lease.
        tokio::time::sleep(lease * 3).await;
        assert!(guard.is_held(), "lost: the renewal kept the 30 s schedule");
        guard.release().await.unwrap();
    }
}
