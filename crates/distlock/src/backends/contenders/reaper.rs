//! One reaper task per backend, whatever the number of holds: it sleeps until the earliest
//! instant planned for any key, then hands the keys whose time came to the backend ([`Reap`]),
//! which deletes what has to go and says when to look again. And one helper that retries a
//! deletion in the background, backing off, until the entry is gone.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::Locked;

/// A backend whose [`Reaper`] this module runs.
pub(crate) trait Reap: Send + Sync + Sized + 'static {
    /// What is planned: an owner token.
    type Key: Copy + Eq + Hash + Send + Sync + 'static;

    /// `key`'s time came: delete what ran out. Returns when to look at `key` again, if ever.
    fn due(self: &Arc<Self>, key: Self::Key) -> impl Future<Output = Option<Instant>> + Send;
}

/// When to look at which key. Dropping it stops the task of [`run`](Reaper::run).
pub(crate) struct Reaper<K> {
    core: Arc<Core<K>>,
    task: Mutex<Option<AbortHandle>>,
}

struct Core<K> {
    plan: Mutex<Plan<K>>,
    /// Rung when the earliest instant moves earlier, and when the plan is dropped.
    wake: Notify,
}

struct Plan<K> {
    /// By instant, then by order of planning.
    by_time: BTreeMap<(Instant, u64), K>,
    by_key: HashMap<K, (Instant, u64)>,
    planned: u64,
    closed: bool,
}

impl<K: Copy + Eq + Hash> Default for Reaper<K> {
    fn default() -> Self {
        Reaper {
            core: Arc::new(Core {
                plan: Mutex::new(Plan {
                    by_time: BTreeMap::new(),
                    by_key: HashMap::new(),
                    planned: 0,
                    closed: false,
                }),
                wake: Notify::new(),
            }),
            task: Mutex::new(None),
        }
    }
}

impl<K: Copy + Eq + Hash> Reaper<K> {
    /// Looks at `key` at `at`, instead of when it was planned before.
    pub(crate) fn schedule(&self, key: K, at: Instant) {
        self.core.plan(key, at, false);
    }

    /// Looks at `key` at `at` at the latest (an earlier plan stays).
    pub(crate) fn schedule_by(&self, key: K, at: Instant) {
        self.core.plan(key, at, true);
    }

    /// Forgets `key`.
    pub(crate) fn cancel(&self, key: K) {
        let mut p = self.core.lock();
        if let Some(at) = p.by_key.remove(&key) {
            p.by_time.remove(&at);
        }
    }

    /// How many keys are planned.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.core.lock().by_key.len()
    }
}

impl<K> Drop for Reaper<K> {
    fn drop(&mut self) {
        self.core.plan.locked().closed = true;
        self.core.wake.notify_one();
    }
}

impl<K: Copy + Eq + Hash> Core<K> {
    fn lock(&self) -> MutexGuard<'_, Plan<K>> {
        self.plan.locked()
    }

    fn plan(&self, key: K, at: Instant, keep_earlier: bool) {
        let mut p = self.lock();
        if let Some(old) = p.by_key.get(&key).copied() {
            if keep_earlier && old.0 <= at {
                return;
            }
            p.by_time.remove(&old);
        }
        let first = p.by_time.first_key_value().map(|((t, _), _)| *t);
        p.planned += 1;
        let at_n = (at, p.planned);
        p.by_key.insert(key, at_n);
        p.by_time.insert(at_n, key);
        drop(p);
        if first.is_none_or(|f| at < f) {
            // A permit is kept when the task is not waiting: it looks again before sleeping.
            self.wake.notify_one();
        }
    }

    /// Takes the keys due at `now`; returns them and the earliest instant left.
    fn take_due(&self, now: Instant) -> Option<(Vec<K>, Option<Instant>)> {
        let mut p = self.lock();
        if p.closed {
            return None;
        }
        let mut due = Vec::new();
        while let Some(((at, _), key)) = p.by_time.first_key_value() {
            if *at > now {
                break;
            }
            let key = *key;
            p.by_time.pop_first();
            p.by_key.remove(&key);
            due.push(key);
        }
        let next = p.by_time.first_key_value().map(|((t, _), _)| *t);
        Some((due, next))
    }
}

impl<K: Copy + Eq + Hash + Send + Sync + 'static> Reaper<K> {
    /// Makes sure `engine`'s reaper task (one per backend, over this plan) runs, starting it in
    /// the current runtime when it has none: a task ends with the runtime it was spawned in,
    /// and a backend may outlive the runtime it connected in. The task holds the backend weakly
    /// and ends when the backend is dropped. Does nothing outside a runtime.
    pub(crate) fn run<E: Reap<Key = K>>(&self, engine: &Arc<E>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut task = self.task.locked();
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let weak: Weak<E> = Arc::downgrade(engine);
        *task = Some(rt.spawn(reap(self.core.clone(), weak)).abort_handle());
    }
}

async fn reap<E: Reap>(core: Arc<Core<E::Key>>, weak: Weak<E>) {
    loop {
        let Some((due, next)) = core.take_due(Instant::now()) else {
            return;
        };
        if !due.is_empty() {
            let Some(engine) = weak.upgrade() else {
                return;
            };
            for key in due {
                if let Some(at) = engine.due(key).await {
                    core.plan(key, at, true);
                }
            }
            continue;
        }
        match next {
            Some(at) => {
                tokio::select! {
                    _ = core.wake.notified() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => core.wake.notified().await,
        }
    }
}

/// First pause of [`retry_until_gone`]; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Runs `attempt` in a task of its own until it answers `true` (the entry is gone, or went with
/// its session), pausing between tries from 20 ms, doubling up to 2 s. Stops when the backend
/// is dropped (its sessions, and the entries in them, end with it); does nothing outside a
/// runtime, for the same reason.
pub(crate) fn retry_until_gone<E, F, Fut>(engine: &Arc<E>, mut attempt: F)
where
    E: Send + Sync + 'static,
    F: FnMut(Arc<E>) -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(engine);
    rt.spawn(async move {
        let mut pause = FIRST_PAUSE;
        loop {
            let Some(engine) = weak.upgrade() else {
                return;
            };
            if attempt(engine).await {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Records the keys it was handed; key 7 asks to be looked at again once.
    #[derive(Default)]
    struct Rec {
        plan: Reaper<u32>,
        seen: Mutex<Vec<u32>>,
        again: AtomicUsize,
    }

    impl Reap for Rec {
        type Key = u32;
        async fn due(self: &Arc<Self>, key: u32) -> Option<Instant> {
            self.seen.lock().unwrap().push(key);
            (key == 7 && self.again.fetch_add(1, Ordering::SeqCst) == 0)
                .then(|| Instant::now() + Duration::from_secs(1))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn keys_come_due_in_time_order_and_cancelled_ones_never() {
        let rec = Arc::new(Rec::default());
        rec.plan.run(&rec);
        let t0 = Instant::now();
        rec.plan.schedule(3, t0 + Duration::from_secs(30));
        rec.plan.schedule(1, t0 + Duration::from_secs(10));
        rec.plan.schedule(2, t0 + Duration::from_secs(20));
        rec.plan.schedule(9, t0 + Duration::from_secs(5));
        rec.plan.cancel(9);
        // A later plan replaces, `schedule_by` keeps the earlier one.
        rec.plan.schedule(3, t0 + Duration::from_secs(40));
        rec.plan.schedule_by(3, t0 + Duration::from_secs(50));
        assert_eq!(rec.plan.len(), 3);
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_eq!(*rec.seen.lock().unwrap(), vec![1]);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(*rec.seen.lock().unwrap(), vec![1, 2, 3]);
        assert_eq!(rec.plan.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_plan_wakes_the_sleeping_task_and_due_may_plan_again() {
        let rec = Arc::new(Rec::default());
        rec.plan.run(&rec);
        let t0 = Instant::now();
        rec.plan.schedule(1, t0 + Duration::from_secs(100));
        tokio::time::sleep(Duration::from_secs(1)).await;
        rec.plan.schedule(7, t0 + Duration::from_secs(2));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*rec.seen.lock().unwrap(), vec![7]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*rec.seen.lock().unwrap(), vec![7, 7]);
        assert_eq!(rec.plan.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_task_ends_with_the_backend() {
        let rec = Arc::new(Rec::default());
        rec.plan.run(&rec);
        rec.plan.run(&rec); // the one task runs on
        let task = rec.plan.task.lock().unwrap().clone().expect("started");
        rec.plan
            .schedule(1, Instant::now() + Duration::from_secs(3600));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!task.is_finished());
        drop(rec);
        // Ends without waiting for the planned instant.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(task.is_finished());
    }

    #[test]
    fn the_task_is_started_again_when_its_runtime_ended() {
        let rt = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("runtime")
        };
        let rec = Arc::new(Rec::default());
        let first = rt();
        first.block_on(async { rec.plan.run(&rec) });
        drop(first);
        rt().block_on(async {
            rec.plan
                .schedule(1, Instant::now() + Duration::from_secs(1));
            rec.plan.run(&rec);
            tokio::time::sleep(Duration::from_secs(2)).await;
        });
        assert_eq!(*rec.seen.lock().unwrap(), vec![1]);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_until_gone() {
        let engine = Arc::new(AtomicUsize::new(0));
        retry_until_gone(&engine, |e: Arc<AtomicUsize>| async move {
            e.fetch_add(1, Ordering::SeqCst) == 4
        });
        // Pauses 20 + 40 + 80 + 160 ms before the fifth try.
        tokio::time::sleep(Duration::from_millis(299)).await;
        assert_eq!(engine.load(Ordering::SeqCst), 4);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(engine.load(Ordering::SeqCst), 5);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(engine.load(Ordering::SeqCst), 5);
    }
}
