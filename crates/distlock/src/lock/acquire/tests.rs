//! Unit tests of the acquisition path over memory backends with hooks.

use std::sync::atomic::AtomicUsize;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use super::*;
use crate::backend::{AcquireRequest, Capabilities, LockInfo, Released};
use crate::backends::memory::MemoryBackend;
use crate::{Backend, LockRegistry, RegistryOptions};

/// Memory locks whose first acquisition reply waits until the gate opens.
#[derive(Debug)]
struct Gated {
    inner: MemoryBackend,
    calls: AtomicUsize,
    gate: Semaphore,
}

#[async_trait]
impl Backend for Gated {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = self.gate.acquire().await;
        }
        self.inner.acquire(request).await
    }
    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        self.inner.release(name, token).await
    }
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        self.inner.extend(name, token, lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

/// Memory locks whose first `failures` releases fail as a restarting server's would.
#[derive(Debug)]
struct Flaky {
    inner: MemoryBackend,
    failures: AtomicUsize,
}

#[async_trait]
impl Backend for Flaky {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.inner.acquire(request).await
    }
    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Err(Error::unavailable("flaky", "connection reset by peer"));
        }
        self.inner.release(name, token).await
    }
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        self.inner.extend(name, token, lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

/// A release that meets a server's restart is reported, and tried again in the background
/// until it goes through: the key does not stay held by nobody for the rest of its lease.
#[tokio::test]
async fn a_release_that_fails_transiently_is_retried_in_the_background() {
    for drop_it in [false, true] {
        let backend = Arc::new(Flaky {
            inner: MemoryBackend::new(),
            failures: AtomicUsize::new(0),
        });
        let options = RegistryOptions::default().with_lease(Duration::from_secs(60));
        let registry = LockRegistry::from_backend(backend.clone(), options).unwrap();
        let lock = registry.obtain("k").unwrap();
        let guard = lock.lock().await.unwrap();
        backend.failures.store(3, Ordering::SeqCst);
        if drop_it {
            drop(guard);
        } else {
            assert!(matches!(
                guard.release().await,
                Err(Error::Unavailable { .. })
            ));
        }
        assert!(
            registry.flush(Duration::from_secs(10)).await,
            "retries ended"
        );
        assert_eq!(backend.failures.load(Ordering::SeqCst), 0);
        assert!(
            lock.inspect().await.unwrap().is_none(),
            "released after the retries (dropped: {drop_it})"
        );
    }
}

/// A registry whose first attempt is held up, and a lock of `kind` on it whose first
/// `try_lock` is in flight (it holds the local lock) when this returns.
async fn with_an_attempt_in_flight(
    handoffs: u32,
    kind: LockKind,
) -> (Arc<Gated>, Lock, tokio::task::JoinHandle<Result<LockGuard>>) {
    let backend = Arc::new(Gated {
        inner: MemoryBackend::new(),
        calls: AtomicUsize::new(0),
        gate: Semaphore::new(0),
    });
    let options = RegistryOptions::default().with_max_local_handoffs(handoffs);
    let registry = LockRegistry::from_backend(backend.clone(), options).unwrap();
    let lock = registry.obtain_kind("k", kind).unwrap();
    let first = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_lock().await }
    });
    while backend.calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    (backend, lock, first)
}

#[tokio::test]
async fn a_shared_try_is_not_refused_for_a_local_attempt_in_flight() {
    for handoffs in [0, 8] {
        for kind in [LockKind::Read, LockKind::Semaphore { permits: 2 }] {
            let (backend, lock, first) = with_an_attempt_in_flight(handoffs, kind).await;
            let second = lock.try_lock().await;
            assert!(second.is_ok(), "{kind} (handoffs {handoffs}): {second:?}");
            backend.gate.add_permits(1);
            let first = first.await.unwrap();
            assert!(first.is_ok(), "{kind} (handoffs {handoffs}): {first:?}");
            if handoffs == 0 {
                assert_ne!(
                    first.unwrap().token(),
                    second.unwrap().token(),
                    "each its own remote hold"
                );
            }
        }
    }
}

#[tokio::test]
async fn an_exclusive_try_is_refused_while_a_local_attempt_is_in_flight() {
    for kind in [LockKind::Mutex, LockKind::Write] {
        let (backend, lock, first) = with_an_attempt_in_flight(0, kind).await;
        assert!(matches!(
            lock.try_lock().await,
            Err(Error::NotAcquired { .. })
        ));
        backend.gate.add_permits(1);
        assert!(first.await.unwrap().is_ok());
    }
}

/// Memory locks behind a fair queue. With `hands_over`, the first attempt finds the lock busy
/// (its request recorded), the second too after a pause, the third is handed the lock; without,
/// every attempt finds it busy with `ahead` contenders before the waiter.
#[derive(Debug)]
struct Queued {
    inner: MemoryBackend,
    hands_over: bool,
    ahead: Option<u32>,
    requests: std::sync::Mutex<Vec<(AcquireRequest, Instant)>>,
}

impl Queued {
    fn new(hands_over: bool, ahead: Option<u32>) -> Arc<Self> {
        Arc::new(Queued {
            inner: MemoryBackend::new(),
            hands_over,
            ahead,
            requests: std::sync::Mutex::new(Vec::new()),
        })
    }
}

#[async_trait]
impl Backend for Queued {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().fifo(true)
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let n = {
            let mut requests = self.requests.lock().unwrap();
            requests.push((request.clone(), Instant::now()));
            requests.len()
        };
        let busy = Attempt::Busy {
            retry_after: None,
            ahead: self.ahead,
        };
        match n {
            _ if !self.hands_over => Ok(busy),
            1 => Ok(busy),
            2 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(busy)
            }
            _ => match self.inner.acquire(request).await? {
                Attempt::Acquired { fence } => Ok(Attempt::HandedOver { fence }),
                other => Ok(other),
            },
        }
    }
    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        self.inner.release(name, token).await
    }
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        self.inner.extend(name, token, lease).await
    }
    async fn subscribe(&self, name: &LockName, waiter: Token) -> Result<ReleaseSubscription> {
        self.inner.subscribe(name, waiter).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

/// A waiting acquisition marks its first try `waits` and queues after it; a lock handed over
/// counts its lease from before the last busy attempt was sent, not from the hand-over.
#[tokio::test]
async fn a_hand_over_counts_the_lease_from_before_the_last_busy_attempt() {
    let backend = Queued::new(true, None);
    let lease = Duration::from_secs(2);
    let options = RegistryOptions::default()
        .with_lease(lease)
        .with_max_poll_interval(Duration::from_millis(20));
    let registry = LockRegistry::from_backend(backend.clone(), options).unwrap();
    let guard = registry.obtain("k").unwrap().lock().await.unwrap();
    let requests = backend.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].0.mode, AcquireMode::Try);
    assert!(requests[0].0.waits, "the try opens a wait");
    assert_eq!(requests[1].0.mode, AcquireMode::Queue);
    assert!(!requests[1].0.waits);
    // Read in this order, the hold's own count can only be the smaller.
    let since_last_busy = requests[1].1.elapsed();
    let remaining = guard.remaining();
    assert!(
        remaining <= lease.saturating_sub(since_last_busy),
        "{remaining:?} left, {since_last_busy:?} since the last busy attempt"
    );
    assert!(remaining < lease - Duration::from_millis(200));
    guard.release().await.unwrap();
}

/// Attempts of one `try_lock_for(wait)` on a lock that stays busy, in paused time.
async fn attempts_while_behind(ahead: Option<u32>, wait: Duration) -> usize {
    let backend = Queued::new(false, ahead);
    let options = RegistryOptions::default().with_max_poll_interval(Duration::from_millis(500));
    let registry = LockRegistry::from_backend(backend.clone(), options).unwrap();
    let lock = registry.obtain("k").unwrap();
    assert!(lock.try_lock_for(wait).await.is_err());
    let attempts = backend.requests.lock().unwrap().len();
    attempts
}

/// A waiter far back in a queue that wakes it in turn polls at a pace spread by its place; one
/// at the head (or of a backend that does not say) at the registry's.
#[tokio::test(start_paused = true)]
async fn a_waiter_far_back_in_the_queue_polls_less_often() {
    let wait = Duration::from_secs(20);
    let unknown = attempts_while_behind(None, wait).await;
    let head = attempts_while_behind(Some(1), wait).await;
    let far = attempts_while_behind(Some(1000), wait).await;
    // 125 ms, 250 ms, then every 500 ms (±20 %): about 40 polls in 20 s.
    assert!(unknown >= 30, "{unknown} attempts");
    assert!(head >= 30, "{head} attempts");
    // The first try, the attempt after subscribing, then 125 ms × 120 = 15 s (±20 %).
    assert!(far <= 4, "{far} attempts");
}

#[test]
fn the_poll_is_spread_by_the_place_up_to_a_bound() {
    let ms = Duration::from_millis;
    let max = ms(500);
    assert_eq!(poll_delay(ms(125), max, None, None), ms(125));
    assert_eq!(poll_delay(ms(500), max, None, Some(0)), ms(500));
    assert_eq!(poll_delay(ms(500), max, None, Some(1)), ms(500));
    // The waiter behind the head too: it takes over from a head that died.
    assert_eq!(poll_delay(ms(500), max, None, Some(2)), ms(500));
    assert_eq!(poll_delay(ms(500), max, None, Some(4)), ms(1500));
    assert_eq!(
        poll_delay(ms(500), max, None, Some(u32::MAX)),
        max * MAX_SPREAD
    );
    // Never later than the holder's lease says the lock could be free.
    assert_eq!(poll_delay(ms(500), max, Some(ms(300)), Some(50)), ms(301));
    assert_eq!(poll_delay(ms(500), max, Some(ms(0)), None), ms(1));
}

/// A waiter that cannot be woken looks again when its turn should be near: next in line
/// soon, and less often while the holder keeps the lock; further back after half the time the
/// last hand-overs say (twice the last pause while nobody is served); at the registry's pace
/// while it knows nothing better.
#[test]
fn a_waiter_that_cannot_be_woken_looks_when_its_turn_comes() {
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let mut turn = TurnWatch::default();
    // Nothing seen served yet.
    assert_eq!(turn.look_after(1000, t0), None);
    // 100 served in 100 ms: 900 more take 900 ms; it looks after half of that.
    assert_eq!(turn.look_after(900, t0 + ms(100)), Some(ms(450)));
    // The place did not move since: twice the last pause.
    assert_eq!(turn.look_after(900, t0 + ms(150)), Some(ms(900)));
    // 880 served in 880 ms: 20 more take 20 ms.
    assert_eq!(turn.look_after(20, t0 + ms(1030)), Some(ms(10)));
    // Right behind the head and at the head: 2 ms, then doubling while the place stays.
    assert_eq!(turn.look_after(2, t0 + ms(1040)), Some(TURN_START));
    assert_eq!(turn.look_after(2, t0 + ms(1042)), Some(ms(4)));
    assert_eq!(turn.look_after(1, t0 + ms(1046)), Some(TURN_START));
    assert_eq!(turn.look_after(1, t0 + ms(1048)), Some(ms(4)));
    let mut at = t0 + ms(1052);
    for _ in 0..4 {
        at += turn.look_after(1, at).unwrap();
    }
    // At most TURN_MOST between two looks, however long the holder keeps the lock.
    assert_eq!(turn.look_after(1, at), Some(TURN_MOST));
    // Its place lost (it joined again at the back): the pace is learnt again.
    assert_eq!(turn.look_after(5000, at + ms(100)), None);
    assert_eq!(turn.look_after(4000, at + ms(1100)), Some(ms(2000)));
}

/// Memory locks that stay busy until `open_at`, with the waiter at the head of a fair queue,
/// and whose subscriptions never fire: a server that refused the waiter's pub/sub connection.
#[derive(Debug)]
struct Deaf {
    inner: MemoryBackend,
    open_at: Instant,
    attempts: AtomicUsize,
}

#[async_trait]
impl Backend for Deaf {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().fifo(true).notifies_release(true)
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if Instant::now() < self.open_at {
            return Ok(Attempt::Busy {
                retry_after: None,
                ahead: Some(1),
            });
        }
        self.inner.acquire(request).await
    }
    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        self.inner.release(name, token).await
    }
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        self.inner.extend(name, token, lease).await
    }
    async fn subscribe(&self, _: &LockName, _: Token) -> Result<ReleaseSubscription> {
        Ok(ReleaseSubscription::never())
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

/// A head that cannot be woken sees the lock free within a few tens of ms, not at its next
/// poll (125 ms, then 250 ms: 300 ms or later here).
#[tokio::test(start_paused = true)]
async fn a_head_that_cannot_be_woken_sees_its_turn_soon() {
    let start = Instant::now();
    let backend = Arc::new(Deaf {
        inner: MemoryBackend::new(),
        open_at: start + Duration::from_millis(200),
        attempts: AtomicUsize::new(0),
    });
    let registry = LockRegistry::from_backend(backend.clone(), RegistryOptions::default()).unwrap();
    let guard = registry.obtain("k").unwrap().lock().await.unwrap();
    let waited = start.elapsed();
    // 2, 4, 8, 16 ms, then 32 ms (±20 %) between looks.
    assert!(waited < Duration::from_millis(240), "waited {waited:?}");
    let attempts = backend.attempts.load(Ordering::SeqCst);
    assert!(attempts <= 16, "{attempts} attempts");
    guard.release().await.unwrap();
}
