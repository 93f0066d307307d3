//! The path of one acquisition through a [`Lock`]: the local lock first, then the remote
//! attempts (queued where the backend is fair, woken by notifications, polling otherwise), the
//! guards that keep it cancel safe, and the take-over of a remote hold a local guard left (the
//! hand-off itself is `Inner::give_up`, in `state.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;
use tracing::Instrument;

use super::{Lock, Wait};
use crate::backend::{
    AcquireMode, AcquireRequest, Attempt, LockKind, LockName, Owner, ReleaseSubscription, Token,
};
use crate::error::{Error, Result};
use crate::guard::{LockGuard, Ownership};
use crate::renewal::{compose_fence, Hold};
use crate::state::{worth_handing_off, Inner, ReadGroup, Slot, SlotState};

impl Lock {
    pub(crate) async fn acquire(&self, wait: Wait) -> Result<LockGuard> {
        let span = tracing::debug_span!(
            "distlock.acquire",
            key = %self.slot.name.key(),
            client = %self.registry.opts.client_id(),
        );
        async move {
            let started = Instant::now();
            self.slot
                .last_used_ms
                .store(self.registry.now_ms(), Ordering::Relaxed);
            let res = self.acquire_kind(wait, started).await;
            let outcome = match &res {
                Ok(_) => "acquired",
                Err(Error::NotAcquired { .. }) => "not_acquired",
                Err(_) => "error",
            };
            crate::metrics::acquire(self.registry.backend.kind(), outcome, started.elapsed());
            res
        }
        .instrument(span)
        .await
    }

    /// The local discipline of each kind: an exclusive hold keeps the local lock for the
    /// guard's life (and may pass its remote hold to the next local holder); a reader joins
    /// the remote read hold of the registry's other readers where it can, and otherwise takes
    /// the local lock only while it contends remotely, as a semaphore permit does.
    ///
    /// A `try_lock` of a shared kind (read, semaphore) that finds the local lock taken makes
    /// its one attempt without it: the local lock is then another reader's or permit's
    /// attempt in flight, whose hold would not exclude this one, so it is no reason to fail.
    async fn acquire_kind(&self, wait: Wait, started: Instant) -> Result<LockGuard> {
        match self.kind() {
            LockKind::Mutex | LockKind::Write => {
                let local = self.lock_local(wait, started).await?;
                self.acquire_exclusive(local, wait, started).await
            }
            LockKind::Read => {
                if let Some(g) = self.join_readers() {
                    return Ok(g);
                }
                let mut local = self.lock_local_shared(wait, started).await?;
                // The reader before us in the local queue may have just made a hold to join.
                if local.is_some() {
                    if let Some(g) = self.join_readers() {
                        return Ok(g);
                    }
                }
                let mut unlocked = SlotState::default();
                let state = local.as_deref_mut().unwrap_or(&mut unlocked);
                let hold = self.remote_hold(state, wait, started).await?;
                let group = Arc::new(ReadGroup::new(hold.clone()));
                *self.slot.readers() = Some(group.clone());
                // Only now may the next local reader look for a hold to join.
                drop(local);
                let fence = compose_fence(hold.backend_fence, 0);
                Ok(self.guard(Ownership::Reader(group), hold, fence))
            }
            LockKind::Semaphore { .. } => {
                let mut local = self.lock_local_shared(wait, started).await?;
                let mut unlocked = SlotState::default();
                let state = local.as_deref_mut().unwrap_or(&mut unlocked);
                let hold = self.remote_hold(state, wait, started).await?;
                drop(local);
                let fence = compose_fence(hold.backend_fence, 0);
                Ok(self.guard(Ownership::Alone, hold, fence))
            }
        }
    }

    /// A guard in the remote read hold of this registry's readers, if it can take one more.
    fn join_readers(&self) -> Option<LockGuard> {
        let current = self.slot.readers();
        let group = current.as_ref()?;
        let seq = group.join(self.registry.opts.max_local_handoffs())?;
        let (group, hold) = (group.clone(), group.hold.clone());
        drop(current);
        let fence = compose_fence(hold.backend_fence, seq);
        Some(self.guard(Ownership::Reader(group), hold, fence))
    }

    /// The guard of a hold now ours.
    fn guard(&self, ownership: Ownership, hold: Arc<Hold>, fence: u64) -> LockGuard {
        LockGuard::new(
            self.slot.clone(),
            self.registry.clone(),
            ownership,
            hold,
            fence,
        )
        .keep_until(self.at_least.and_then(|d| Instant::now().checked_add(d)))
    }

    fn not_acquired(&self, started: Instant) -> Error {
        Error::NotAcquired {
            key: self.key().to_owned(),
            waited: started.elapsed(),
        }
    }

    /// The local lock for a shared kind's attempt; `None` for a `try_lock` that found it
    /// taken, which then attempts without it (see `acquire_kind`).
    async fn lock_local_shared(
        &self,
        wait: Wait,
        started: Instant,
    ) -> Result<Option<OwnedMutexGuard<SlotState>>> {
        if let Wait::No = wait {
            return Ok(self.slot.local().state.clone().try_lock_owned().ok());
        }
        self.lock_local(wait, started).await.map(Some)
    }

    async fn lock_local(&self, wait: Wait, started: Instant) -> Result<OwnedMutexGuard<SlotState>> {
        let state = self.slot.local().state.clone();
        if let Ok(g) = state.clone().try_lock_owned() {
            return Ok(g);
        }
        if let Wait::No = wait {
            return Err(self.not_acquired(started));
        }
        let _waiting = WaiterEntry::new(&self.slot, &self.registry);
        match wait.deadline() {
            None => Ok(state.lock_owned().await),
            Some(d) => tokio::time::timeout_at(d, state.lock_owned())
                .await
                .map_err(|_| self.not_acquired(started)),
        }
    }

    async fn acquire_exclusive(
        &self,
        mut local: OwnedMutexGuard<SlotState>,
        wait: Wait,
        started: Instant,
    ) -> Result<LockGuard> {
        let reg = &self.registry;
        if let Some(hold) = local.hold.clone() {
            // Lock cohorting: take over the remote hold the previous local holder left us,
            // provided enough of its lease is left to be worth it.
            if worth_handing_off(&hold) {
                let seq = hold.local_seq.fetch_add(1, Ordering::AcqRel) + 1;
                let fence = compose_fence(hold.backend_fence, seq);
                return Ok(self.guard(Ownership::Exclusive(local), hold, fence));
            }
            local.hold = None;
            reg.renewer.deregister(&hold);
            reg.release_in_background(hold.name.clone(), hold.token);
        }
        let hold = self.remote_hold(&mut local, wait, started).await?;
        local.hold = Some(hold.clone());
        let fence = compose_fence(hold.backend_fence, 0);
        Ok(self.guard(Ownership::Exclusive(local), hold, fence))
    }

    /// Takes a new remote hold, with the local lock held: attempts, queued where the backend
    /// is fair, woken by notifications, polling otherwise, until acquired or the wait ends.
    /// The hold is registered for renewal.
    async fn remote_hold(
        &self,
        local: &mut SlotState,
        wait: Wait,
        started: Instant,
    ) -> Result<Arc<Hold>> {
        let reg = &self.registry;
        let backend = &reg.backend;
        let name = &self.slot.name;
        let deadline = wait.deadline();
        let waits = !matches!(wait, Wait::No);
        let token = Token::random();
        let max_poll = reg.max_poll();
        let caps = backend.capabilities();
        let notifies = caps.notifies_release;
        // A waiter joins the backend's fair queue, where there is one (and leaves it when it
        // gives up), once it has seen the lock busy, or when the last acquisition of the key
        // had to wait; until then an attempt is a plain try, which a backend can make cheaper.
        // A backend with read-write locks also queues a waiting exclusive attempt, which
        // keeps new readers out until it is served.
        let queues = waits && (caps.fifo || (caps.read_write && self.kind().is_exclusive()));
        let expect_busy = local.contended;
        let mut sub: Option<ReleaseSubscription> = None;
        // With notifications, polling only catches expiry and lost messages: start slower.
        let mut poll = if notifies {
            max_poll / 4
        } else {
            Duration::from_millis(2)
        }
        .min(max_poll);
        let mut error_backoff = Duration::from_millis(20);
        let mut queued = QueueEntry {
            registry: reg,
            name,
            token,
            joined: false,
        };
        let mut was_busy = false;
        let mut last_busy_sent: Option<Instant> = None;
        // Contenders before this token in the backend's queue, when the backend wakes it in
        // turn (see `Attempt::Busy::ahead`).
        let mut ahead: Option<u32> = None;
        let mut turn = TurnWatch::default();

        // Having just released a lock others were waiting for, let one of them have it first.
        if let Some(until) = local.yield_until.take().filter(|t| *t > Instant::now()) {
            let until = deadline.map_or(until, |d| d.min(until));
            if notifies {
                tracing::trace!(target: "distlock::probe", ev = "yield");
                if let Ok(mut s) = backend.subscribe(name, token).await {
                    tracing::trace!(target: "distlock::probe", ev = "yield_sub");
                    let y = tokio::time::timeout_at(until, s.released()).await;
                    tracing::trace!(target: "distlock::probe",
                        ev = if y.is_ok() { "yield_woken" } else { "yield_timeout" });
                    sub = Some(s);
                }
            } else {
                tokio::time::sleep_until(until).await;
            }
        }
        // The last acquisition of this key had to wait: expect to wait again and listen before
        // the first attempt, which saves the attempt that would follow a late subscription.
        if waits && notifies && sub.is_none() && expect_busy {
            sub = backend.subscribe(name, token).await.ok();
        }

        // Armed once an attempt ended without telling us its outcome (an error, a lost reply):
        // the lock may then be ours on the server, so however this acquisition ends without a
        // guard (returned, or dropped at any await below), the token is given back.
        let mut uncertain = Abandoned {
            registry: reg,
            name,
            token,
            armed: false,
        };
        loop {
            let mode = if queues && (was_busy || expect_busy) {
                AcquireMode::Queue
            } else {
                AcquireMode::Try
            };
            // A busy reply to this try is followed at once by a queued attempt (see below).
            let opens_wait = mode == AcquireMode::Try && queues && notifies && sub.is_none();
            let sent = Instant::now();
            tracing::trace!(target: "distlock::probe", ev = "attempt");
            let mut in_flight =
                InFlight::start(reg, name, token, self.lease, mode, opens_wait, &self.owner);
            // `try_lock_for` bounds its attempts too: a reply that comes after the deadline is
            // not waited for (the attempt finishes in the background, then is undone).
            let attempt = match wait {
                Wait::Until(d) => match tokio::time::timeout_at(d, in_flight.outcome()).await {
                    Ok(a) => a,
                    Err(_) => {
                        // The in-flight attempt's undo releases and leaves the queue, after it.
                        queued.joined = false;
                        uncertain.armed = false;
                        drop(in_flight);
                        local.contended = true;
                        return Err(self.not_acquired(started));
                    }
                },
                _ => in_flight.outcome().await,
            };
            in_flight.finished();
            tracing::trace!(target: "distlock::probe", ev = match &attempt {
                Ok(Attempt::Busy { .. }) => "busy",
                Ok(_) => "got",
                Err(_) => "error",
            });
            let sent = match attempt {
                Ok(Attempt::Busy { .. }) => {
                    last_busy_sent = Some(sent);
                    queued.joined = mode == AcquireMode::Queue;
                    sent
                }
                // A lock handed to us while we waited: its lease is counted from before the
                // last attempt that found the lock busy (were there none, from before the
                // first attempt of this token).
                Ok(Attempt::HandedOver { .. }) => last_busy_sent.unwrap_or(started),
                _ => sent,
            };
            uncertain.armed |= attempt.is_err();
            let retry_after = match attempt {
                Ok(Attempt::Acquired { .. } | Attempt::HandedOver { .. })
                    if arrived_too_late(sent, self.lease) =>
                {
                    // The reply took (nearly) the whole lease, counted from before the
                    // request: the server may have let the lease run out and handed the lock
                    // on meanwhile, and a guard made now would start out lost, or lose the
                    // lock before its first renewal could land. Give the token back (the
                    // attempt has completed, so the release cannot overtake it) and go on as
                    // if the lock had been busy.
                    tracing::debug!(waited = ?started.elapsed(), "acquired too late to hold");
                    queued.joined = false;
                    uncertain.armed = true;
                    if backend.release(name, token).await.is_ok() {
                        uncertain.armed = false;
                    }
                    was_busy = true;
                    None
                }
                Ok(
                    Attempt::Acquired {
                        fence: backend_fence,
                    }
                    | Attempt::HandedOver {
                        fence: backend_fence,
                    },
                ) => {
                    queued.joined = false;
                    uncertain.armed = false;
                    local.contended = was_busy;
                    let hold = Arc::new(Hold::new(
                        backend.kind(),
                        name.clone(),
                        token,
                        backend_fence,
                        self.lease,
                        sent,
                    ));
                    reg.renewer.register(hold.clone());
                    tracing::debug!(fence = backend_fence, waited = ?started.elapsed(), "acquired");
                    return Ok(hold);
                }
                Ok(Attempt::Busy {
                    retry_after,
                    ahead: a,
                }) => {
                    was_busy = true;
                    ahead = a;
                    retry_after
                }
                Err(e) => {
                    let now = Instant::now();
                    match deadline {
                        Some(d) if e.is_retryable() && now + error_backoff < d => {
                            tracing::debug!(error = %e, "acquire attempt failed; retrying");
                            tokio::time::sleep(error_backoff).await;
                            error_backoff = (error_backoff * 2).min(Duration::from_secs(1));
                            continue;
                        }
                        _ => {
                            queued.leave().await;
                            return Err(e);
                        }
                    }
                }
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                queued.leave().await;
                local.contended = true;
                return Err(self.not_acquired(started));
            }
            if notifies && sub.is_none() {
                // Subscribe, then try again at once: a release between the failed attempt and
                // the subscription would otherwise go unnoticed until the next poll.
                // A subscription that fails leaves the waiter polling, which still works.
                sub = Some(backend.subscribe(name, token).await.unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "no release notifications; polling");
                    ReleaseSubscription::never()
                }));
                continue;
            }
            // Without a notification, poll: soon at first, then backing off, never later than
            // the holder's lease says the lock could be free; spread by the place in the
            // queue when the backend wakes this waiter in its turn.
            let listens = sub.as_ref().is_some_and(ReleaseSubscription::listens);
            let mut delay = poll_delay(poll, max_poll, retry_after, ahead.filter(|_| listens));
            if let (false, Some(a)) = (listens, ahead) {
                // Nobody will tell this waiter that its turn came (its subscription failed, e.g.
                // on a server out of connections): a lock handed to it waits for its next look.
                if let Some(d) = turn.look_after(a, Instant::now()) {
                    delay = delay.min(d);
                }
            }
            let delay = jitter(delay);
            poll = (poll * 2).min(max_poll);
            let wake_at =
                deadline.map_or(Instant::now() + delay, |d| d.min(Instant::now() + delay));
            let span = tracing::trace_span!("distlock.wait", delay = ?delay);
            async {
                match sub.as_mut() {
                    Some(s) => {
                        let woken = tokio::time::timeout_at(wake_at, s.released()).await;
                        tracing::trace!(target: "distlock::probe",
                            ev = if woken.is_ok() { "woken" } else { "poll" });
                    }
                    None => tokio::time::sleep_until(wake_at).await,
                }
            }
            .instrument(span)
            .await;
        }
    }
}

/// A place in the backend's wait queue: given back when the waiter gives up, in the
/// background if the acquisition future is dropped.
struct QueueEntry<'a> {
    registry: &'a Inner,
    name: &'a LockName,
    token: Token,
    joined: bool,
}

impl QueueEntry<'_> {
    async fn leave(&mut self) {
        if std::mem::take(&mut self.joined) {
            if let Err(e) = self
                .registry
                .backend
                .leave_queue(self.name, self.token)
                .await
            {
                tracing::debug!(error = %e, "leaving the wait queue failed; the entry will expire");
            }
        }
    }
}

impl Drop for QueueEntry<'_> {
    fn drop(&mut self) {
        if self.joined {
            let backend = self.registry.backend.clone();
            let (name, token) = (self.name.clone(), self.token);
            self.registry.background.spawn(async move {
                let _ = backend.leave_queue(&name, token).await;
            });
        }
    }
}

/// The most a queued waiter's poll is spread by its place (`max_poll` × this): a bound on how
/// late a waiter deep in the queue notices a wake-up that was lost.
const MAX_SPREAD: u32 = 120;

/// The pause before the next poll of a waiter: `poll` (its backed-off pace, at most
/// `max_poll`), no later than the holder's remaining lease (`retry_after`, plus a millisecond),
/// and, for a waiter that its backend wakes in turn with `ahead` contenders before it, `poll`
/// times `ahead - 1` (at most [`MAX_SPREAD`]). The head and the waiter behind it poll at the
/// registry's pace, so a head that died is noticed as soon as before; W waiters make about
/// `ln W` polls per `max_poll`, not W.
pub(super) fn poll_delay(
    poll: Duration,
    max_poll: Duration,
    retry_after: Option<Duration>,
    ahead: Option<u32>,
) -> Duration {
    let spread = ahead.map_or(1, |n| n.saturating_sub(1).clamp(1, MAX_SPREAD));
    let mut delay = poll.min(max_poll).saturating_mul(spread);
    if let Some(r) = retry_after {
        delay = delay
            .max(Duration::from_millis(1))
            .min(r + Duration::from_millis(1));
    }
    delay
}

/// The first pause of a waiter next in line that cannot be woken, doubled at each look
/// after up to [`TURN_MOST`]. The bound is what one hand-over to such a waiter costs at most,
/// and so what each costs in a run of them: a waiter that doubled without bound while the one
/// before it, which could not be woken either, took long to notice the lock would take about
/// as long again.
const TURN_START: Duration = Duration::from_millis(2);
const TURN_MOST: Duration = Duration::from_millis(32);

/// When a waiter that its backend ranks but cannot wake should look again, so that it sees a
/// lock handed to it soon after the hand-over instead of up to a poll later: at the head and
/// right behind it (`ahead` 1 or 2) from [`TURN_START`] on, doubling up to [`TURN_MOST`] while
/// its place does not move (at most about 30 looks a second from each of the two); further
/// back, after half the time the hand-overs since its last look say its turn is away (so that
/// it reaches those two places before its turn comes), and after twice its last pause when
/// nobody was served since.
#[derive(Debug, Default)]
pub(super) struct TurnWatch {
    /// The last look: places before the waiter then, and when.
    last: Option<(u32, Instant)>,
    still: Duration,
}

impl TurnWatch {
    /// Records a busy attempt that found `ahead` contenders before the waiter at `now`; the
    /// pause before the next look, or `None` when the registry's pace is as good as any.
    pub(super) fn look_after(&mut self, ahead: u32, now: Instant) -> Option<Duration> {
        let last = self.last.replace((ahead, now));
        if ahead <= 2 {
            self.still = if last.is_some_and(|(a, _)| a == ahead) {
                self.still.saturating_mul(2).clamp(TURN_START, TURN_MOST)
            } else {
                TURN_START
            };
            return Some(self.still);
        }
        let (before, then) = last?;
        self.still = match before.checked_sub(ahead) {
            // Turns come at the pace of the last ones: the waiter's own after `ahead` more.
            Some(served) if served > 0 => now
                .saturating_duration_since(then)
                .mul_f64(f64::from(ahead) / f64::from(served) / 2.0)
                .max(TURN_START),
            // Nobody served since the last look (a holder that keeps the lock, or one that
            // cannot be woken either and has not noticed it yet): twice the last pause.
            Some(_) => self.still.saturating_mul(2),
            // The place was lost and taken again at the back: the pace is learnt again.
            None => Duration::ZERO,
        };
        (!self.still.is_zero()).then_some(self.still)
    }
}

fn jitter(d: Duration) -> Duration {
    let f: f64 = rand::random_range(0.8..1.2);
    d.mul_f64(f)
}

/// Counts a local waiter for as long as it waits; the last one to leave cleans up an orphaned
/// remote hold.
struct WaiterEntry<'a> {
    slot: &'a Arc<Slot>,
    registry: &'a Inner,
}

impl<'a> WaiterEntry<'a> {
    fn new(slot: &'a Arc<Slot>, registry: &'a Inner) -> Self {
        slot.waiters().fetch_add(1, Ordering::SeqCst);
        WaiterEntry { slot, registry }
    }
}

impl Drop for WaiterEntry<'_> {
    fn drop(&mut self) {
        if self.slot.waiters().fetch_sub(1, Ordering::SeqCst) == 1 {
            self.slot.release_orphaned_hold(self.registry);
        }
    }
}

/// Gives back, in the background, a token that an earlier attempt may have acquired without
/// the reply saying so, unless disarmed by the acquisition that got its guard.
struct Abandoned<'a> {
    registry: &'a Inner,
    name: &'a LockName,
    token: Token,
    armed: bool,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.registry
                .release_in_background(self.name.clone(), self.token);
        }
    }
}

/// The outcome of one remote attempt, boxed so that it can outlive the acquisition future.
type AttemptFuture = Pin<Box<dyn Future<Output = Result<Attempt>> + Send>>;

/// One remote attempt in flight. If the acquisition ends before the attempt does (its future
/// is dropped, or `try_lock_for`'s deadline passes), the attempt may still succeed on the
/// server: it is then driven to its end in the background and only after that is its token
/// released and its place in the wait queue given back, so the undo can never overtake it.
struct InFlight<'a> {
    registry: &'a Inner,
    name: &'a LockName,
    token: Token,
    queued: bool,
    attempt: Option<AttemptFuture>,
}

impl<'a> InFlight<'a> {
    #[allow(clippy::too_many_arguments)]
    fn start(
        registry: &'a Inner,
        name: &'a LockName,
        token: Token,
        lease: Duration,
        mode: AcquireMode,
        waits: bool,
        owner: &Owner,
    ) -> Self {
        let backend = registry.backend.clone();
        let request = AcquireRequest::new(name.clone(), token, lease)
            .with_mode(mode)
            .with_waits(waits)
            .with_owner(owner.clone());
        let attempt: AttemptFuture = Box::pin(async move { backend.acquire(&request).await });
        InFlight {
            registry,
            name,
            token,
            queued: mode == AcquireMode::Queue,
            attempt: Some(attempt),
        }
    }

    /// Drives the attempt; cancel safe (the attempt stays here, see Drop).
    async fn outcome(&mut self) -> Result<Attempt> {
        match self.attempt.as_mut() {
            Some(attempt) => attempt.await,
            None => Err(Error::backend(
                "registry",
                "attempt polled after it finished",
            )),
        }
    }

    /// The attempt ended and its outcome was seen: nothing to undo here.
    fn finished(mut self) {
        self.attempt = None;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(attempt) = self.attempt.take() else {
            return;
        };
        let backend = self.registry.backend.clone();
        let (name, token, queued) = (self.name.clone(), self.token, self.queued);
        let spawned = self.registry.background.spawn(async move {
            // Finish the attempt first: a release sent beside it could reach the server first.
            // Release even after `Busy`: an earlier attempt with this token may have been the
            // one that succeeded (owner-checked, so harmless otherwise).
            let _ = attempt.await;
            if let Err(e) = backend.release(&name, token).await {
                tracing::debug!(lock = ?name, error = %e, "undoing an abandoned acquisition failed; the lease will expire");
            }
            if queued {
                let _ = backend.leave_queue(&name, token).await;
            }
        });
        if !spawned {
            tracing::debug!(lock = ?self.name, "acquisition dropped outside a runtime; the lease will expire");
        }
    }
}

/// Whether an attempt sent at `sent` that reports the lock acquired came back too late to be
/// held: a tenth of the lease or less is left of it. The client counts the lease from before
/// the request, so the server's lease, counted from when it applied the attempt, never ends
/// before the client's; but once the client's has run out, somebody else may hold the lock.
fn arrived_too_late(sent: Instant, lease: Duration) -> bool {
    (sent + lease).saturating_duration_since(Instant::now()) <= lease / 10
}

#[cfg(all(test, feature = "memory"))]
mod tests;
