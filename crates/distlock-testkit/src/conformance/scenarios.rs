//! The scenarios that run in one process: mutual exclusion across registries, try, timed and
//! blocking acquisition, owner checks, leases, renewal, lost signals, fencing, reentrancy,
//! cancel safety, local FIFO, odd keys, invalid input, handle expiry and many keys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use futures_util::stream::{self, StreamExt};

use super::{short_lease, within, Harness};
use distlock::Error;
use distlock::{AcquireMode, AcquireRequest, Attempt, LockName, Renewal, Token};
use distlock::{LockRegistry, RegistryOptions};

/// Many tasks over four registries increment a non-atomic counter under the lock: no two are
/// ever inside at once and no update is lost.
pub async fn mutual_exclusion_across_registries(h: &Harness) {
    let inside = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let reg = h.registry().await;
        for _ in 0..3 {
            let (reg, inside, counter) = (reg.clone(), inside.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let g = reg.obtain("counter").unwrap().lock().await.unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    let v = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(v + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    within(Duration::from_secs(60), "120 lock cycles", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert_eq!(counter.load(Ordering::SeqCst), 120, "lost updates");
}

/// `try_lock` on a held lock fails at once with `NotAcquired`, from another registry and from
/// the same one.
pub async fn try_lock_fails_fast_when_held(h: &Harness) {
    let a = h.registry().await;
    let b = h.registry().await;
    let limit = h.limit(Duration::from_secs(1), 20).await;
    let g = a.obtain("k").unwrap().lock().await.unwrap();
    let started = Instant::now();
    let err = b.obtain("k").unwrap().try_lock().await.unwrap_err();
    assert!(matches!(err, Error::NotAcquired { .. }), "got {err:?}");
    let err = a.obtain("k").unwrap().try_lock().await.unwrap_err();
    assert!(matches!(err, Error::NotAcquired { .. }), "got {err:?}");
    assert!(
        started.elapsed() < limit,
        "try_lock waited {:?} (limit {limit:?})",
        started.elapsed()
    );
    g.release().await.unwrap();
    crate::holds::free(&b, "k", "free after release").await;
}

/// `try_lock_for` waits about as long as asked, then gives up with `NotAcquired`.
pub async fn try_lock_for_honours_deadline(h: &Harness) {
    let a = h.registry().await;
    let b = h.registry().await;
    let limit = h.limit(Duration::from_millis(1500), 10).await;
    let g = a.obtain("k").unwrap().lock().await.unwrap();
    let started = Instant::now();
    let err = b
        .obtain("k")
        .unwrap()
        .try_lock_for(Duration::from_millis(300))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, Error::NotAcquired { .. }), "got {err:?}");
    assert!(
        waited >= Duration::from_millis(290),
        "gave up early after {waited:?}"
    );
    assert!(
        waited < limit,
        "overran the deadline: {waited:?} (limit {limit:?})"
    );
    g.release().await.unwrap();
}

/// A blocked `lock()` gets the lock soon after the holder releases it.
pub async fn blocking_lock_waits_for_release(h: &Harness) {
    let a = h.registry().await;
    let b = h.registry().await;
    let g = a.obtain("k").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = b.obtain("k").unwrap().lock().await.unwrap();
        let at = Instant::now();
        g.release().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "waiter got a held lock");
    let released = Instant::now();
    g.release().await.unwrap();
    let acquired = within(Duration::from_secs(5), "waiter after release", waiter)
        .await
        .unwrap();
    let reaction = acquired - released;
    // A waiter woken by a notification reacts within a few round trips; one that polls within
    // its polling period. Both grow with the machine's measured pace.
    let base = if h.capabilities().await.notifies_release {
        300
    } else {
        500
    };
    let limit = h.limit(Duration::from_millis(base), 10).await;
    assert!(
        reaction < limit,
        "waiter reacted after {reaction:?} (limit {limit:?})"
    );
}

/// Release and extend with another owner's token change nothing.
pub async fn release_is_owner_checked(h: &Harness) {
    let backend = h.backend().await;
    let name = LockName::new(h.prefix(), "owned").unwrap();
    let (mine, other) = (Token::random(), Token::random());
    let lease = Duration::from_secs(10);
    assert!(matches!(
        backend
            .acquire(&AcquireRequest::new(name.clone(), mine, lease))
            .await
            .unwrap(),
        Attempt::Acquired { .. }
    ));
    assert!(matches!(
        backend
            .acquire(&AcquireRequest::new(name.clone(), other, lease))
            .await
            .unwrap(),
        Attempt::Busy { .. }
    ));
    assert!(
        !backend.release(&name, other).await.unwrap().was_held,
        "foreign release succeeded"
    );
    assert!(
        !backend.extend(&name, other, lease).await.unwrap(),
        "foreign extend succeeded"
    );
    assert!(
        backend.inspect(&name).await.unwrap().is_some(),
        "lock vanished after foreign release"
    );
    assert!(backend.extend(&name, mine, lease).await.unwrap());
    assert!(backend.release(&name, mine).await.unwrap().was_held);
    assert!(
        backend.inspect(&name).await.unwrap().is_none(),
        "lock still there after release"
    );
    assert!(
        !backend.release(&name, mine).await.unwrap().was_held,
        "double release succeeded"
    );
}

/// Without renewal a lease ends by itself: another registry gets the lock, and the old guard
/// knows it is lost.
pub async fn lease_expiry_frees_lock(h: &Harness) {
    let a = h.unrenewed_registry(Duration::from_millis(300)).await;
    let b = h.registry().await;
    let g = a.obtain("k").unwrap().lock().await.unwrap();
    let started = Instant::now();
    let g2 = b
        .obtain("k")
        .unwrap()
        .try_lock_for(Duration::from_secs(3))
        .await
        .expect("free after lease");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "taken before the lease ended"
    );
    assert!(!g.is_held());
    if h.capabilities().await.fences() {
        assert!(g2.fence() > g.fence());
    }
    assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    g2.release().await.unwrap();
}

/// With renewal, a guard keeps the lock well past its lease (three leases here).
pub async fn renewal_keeps_lock_past_lease(h: &Harness) {
    // Renewal runs at a third of the lease, so a renewal has two thirds of it to complete: the
    // lease leaves room for a loaded machine's round trips and scheduling stalls.
    let lease = Duration::from_secs(1).max(h.cycle_time().await * 30);
    let a = h
        .registry_with(RegistryOptions::default().with_lease(lease))
        .await;
    let b = h.registry().await;
    let g = a.obtain("k").unwrap().lock().await.unwrap();
    tokio::time::sleep(lease * 3).await;
    assert!(g.is_held(), "lost despite renewal");
    assert!(matches!(
        b.obtain("k").unwrap().try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
    g.extend(Duration::from_millis(500)).await.unwrap();
    g.release().await.unwrap();
}

/// Deleting the lock on the server underneath a holder fires its lost signal within about one
/// renewal period, and every later operation reports `LockLost`.
pub async fn lost_signal_fires_when_key_deleted(h: &Harness) {
    // Noticed by the next renewal (a third of the lease) or at the latest when the lease ends.
    let limit = h.limit(Duration::from_secs(2), 10).await;
    let a = h.registry_with(short_lease()).await;
    let g = a.obtain("k").unwrap().lock().await.unwrap();
    assert!(
        h.delete("k").await,
        "the harness has no deleter: give it one with Harness::with_deleter"
    );
    within(limit, "lost signal", g.lost()).await;
    assert!(!g.is_held());
    assert!(matches!(g.ensure_held(), Err(Error::LockLost { .. })));
    assert!(matches!(
        g.extend(Duration::from_secs(1)).await,
        Err(Error::LockLost { .. })
    ));
    assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
}

/// Without renewal, the lost signal fires when the lease runs out.
pub async fn lost_signal_fires_when_lease_expires(h: &Harness) {
    let a = h.unrenewed_registry(Duration::from_millis(200)).await;
    // The lease counts from when the request was sent, so measure from before it.
    let started = Instant::now();
    let g = a.obtain("k").unwrap().lock().await.unwrap();
    within(Duration::from_secs(2), "lost signal", g.lost()).await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(matches!(g.ensure_held(), Err(Error::LockLost { .. })));
}

/// Fences strictly increase per key across holders, registries and local handoffs. Runs
/// only on backends whose capabilities promise fencing (not [`Fencing::None`](distlock::Fencing)).
pub async fn fencing_is_monotonic(h: &Harness) {
    let regs = [h.registry().await, h.registry().await, h.registry().await];
    let mut last = 0;
    for i in 0..12 {
        let g = regs[i % 3].obtain("fenced").unwrap().lock().await.unwrap();
        assert!(g.fence() > last, "fence {} after {last}", g.fence());
        last = g.fence();
        g.release().await.unwrap();
    }
    // Local handoffs within one remote hold keep increasing too.
    let reg = regs[0].clone();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (reg, seen) = (reg.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let g = reg.obtain("fenced").unwrap().lock().await.unwrap();
                seen.lock().unwrap().push(g.fence());
                tokio::task::yield_now().await;
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(30), "local handoffs", t)
            .await
            .unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert!(seen[0] > last);
    assert!(
        seen.windows(2).all(|w| w[1] > w[0]),
        "fences not increasing: {seen:?}"
    );
}

/// The blocking facade is reentrant per thread and excludes other threads.
pub async fn blocking_facade_is_reentrant(h: &Harness) {
    let backend = h.backend().await;
    let prefix = h.prefix().to_owned();
    tokio::task::spawn_blocking(move || {
        let reg = super::blocking_registry(backend, prefix);
        let lock = reg.obtain("re").unwrap();
        lock.lock().unwrap();
        lock.lock().unwrap();
        assert_eq!(lock.hold_count(), 2);
        let other = lock.clone();
        let t = std::thread::spawn(move || other.try_lock_for(Duration::from_millis(100)).unwrap());
        assert!(
            !t.join().unwrap(),
            "another thread entered a held reentrant lock"
        );
        lock.unlock().unwrap();
        assert!(lock.is_held_by_current_thread());
        lock.unlock().unwrap();
        assert!(matches!(lock.unlock(), Err(Error::NotHeld { .. })));
        let other = lock.clone();
        let t = std::thread::spawn(move || {
            let ok = other.try_lock_for(Duration::from_secs(2)).unwrap();
            other.unlock().unwrap();
            ok
        });
        assert!(t.join().unwrap(), "lock not free after the last unlock");
    })
    .await
    .unwrap();
}

/// Dropping acquisition futures, while waiting locally, remotely or mid-request, leaves nothing
/// held and no waiter behind.
pub async fn cancelled_acquisitions_leave_nothing_behind(h: &Harness) {
    let a = h.registry().await;
    let b = h.registry().await;
    let g = a.obtain("c").unwrap().lock().await.unwrap();
    // Waiting remotely (b) and locally (a) when cancelled.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), b.obtain("c").unwrap().lock())
            .await
            .is_err()
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(100), a.obtain("c").unwrap().lock())
            .await
            .is_err()
    );
    g.release().await.unwrap();
    let c = h.registry().await;
    let g = within(
        Duration::from_secs(2),
        "lock after cancelled waiters",
        c.obtain("c").unwrap().lock(),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
    // Cancelled at random points, including while the remote request is in flight.
    for i in 0..40u64 {
        let lock = b.obtain("c").unwrap();
        let _ = tokio::time::timeout(Duration::from_micros(50 * i), lock.lock()).await;
    }
    let g = within(
        Duration::from_secs(3),
        "lock after random cancellations",
        async {
            c.obtain("c")
                .unwrap()
                .try_lock_for(Duration::from_secs(2))
                .await
        },
    )
    .await
    .expect("a cancelled acquisition kept the lock");
    g.release().await.unwrap();
}

/// Local waiters of one registry are served in arrival order.
pub async fn local_waiters_are_fifo(h: &Harness) {
    let reg = h.registry().await;
    let g = reg.obtain("q").unwrap().lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (reg, order) = (reg.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = reg.obtain("q").unwrap().lock().await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    g.release().await.unwrap();
    for t in tasks {
        within(Duration::from_secs(10), "queued waiters", t)
            .await
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
}

/// Unusual keys work and stay distinct from each other.
pub async fn odd_keys_are_distinct_locks(h: &Harness) {
    let reg = h.registry().await;
    let caps = h.capabilities().await;
    // A layout with a shorter name column (ShedLock's) takes the longest key that fits with
    // the harness's prefix, and refuses one more with a typed error.
    let room = if caps.max_key_len < distlock::MAX_KEY_LEN {
        let room = caps.max_key_len - h.prefix().chars().count() - 1;
        assert!(
            matches!(
                reg.obtain(&"x".repeat(room + 1)).unwrap().try_lock().await,
                Err(Error::InvalidKey(_))
            ),
            "a key longer than the layout's column"
        );
        room
    } else {
        distlock::MAX_KEY_LEN
    };
    let long = "x".repeat(room);
    let keys = [
        "a/b",
        "a:b",
        "a b",
        "ünï cødé ✓",
        "{tag}k",
        "k}",
        "'; DROP TABLE x; --",
        "%",
        long.as_str(),
    ];
    let mut guards = Vec::new();
    for k in keys {
        guards.push(
            reg.obtain(k)
                .unwrap()
                .try_lock()
                .await
                .unwrap_or_else(|e| panic!("{k:?}: {e}")),
        );
    }
    let other = h.registry().await;
    for k in keys {
        assert!(
            matches!(
                other.obtain(k).unwrap().try_lock().await,
                Err(Error::NotAcquired { .. })
            ),
            "{k:?}"
        );
        let info = other.obtain(k).unwrap().inspect().await.unwrap();
        assert!(info.is_some(), "{k:?} not visible");
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Bad keys and options are typed errors.
pub async fn invalid_input_is_rejected(h: &Harness) {
    let reg = h.registry().await;
    assert!(matches!(reg.obtain(""), Err(Error::InvalidKey(_))));
    assert!(matches!(
        reg.obtain(&"x".repeat(distlock::MAX_KEY_LEN + 1)),
        Err(Error::InvalidKey(_))
    ));
    let lock = reg.obtain("ok").unwrap();
    assert!(matches!(
        lock.with_lease(Duration::ZERO),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        lock.with_lease(Duration::from_secs(2 * 86_400)),
        Err(Error::InvalidConfig(_))
    ));
    let g = lock.lock().await.unwrap();
    assert!(matches!(
        g.extend(Duration::ZERO).await,
        Err(Error::InvalidConfig(_))
    ));
    g.release().await.unwrap();
    let bad = LockRegistry::from_backend(
        h.backend().await,
        RegistryOptions::default().with_lease(Duration::ZERO),
    );
    assert!(matches!(bad, Err(Error::InvalidConfig(_))));
}

/// Idle handles can be expired; held ones never are.
pub async fn unused_handles_expire(h: &Harness) {
    let reg = h.registry().await;
    for i in 0..100 {
        drop(reg.obtain(&format!("idle{i}")).unwrap());
    }
    let g = reg.obtain("held").unwrap().lock().await.unwrap();
    assert_eq!(reg.cached_locks(), 101);
    assert_eq!(reg.expire_unused_older_than(Duration::ZERO), 100);
    assert_eq!(reg.cached_locks(), 1);
    g.release().await.unwrap();
    assert_eq!(reg.expire_unused_older_than(Duration::from_secs(3600)), 0);
    assert_eq!(reg.expire_unused_older_than(Duration::ZERO), 1);
}

/// Thousands of keys held at once by one registry, renewed in batches, all released.
pub async fn thousands_of_keys_at_once(h: &Harness) {
    let (n, in_flight) = (2000, 4);
    let lease = many_keys_lease(h, n, in_flight).await;
    let reg = h
        .registry_with(RegistryOptions::default().with_lease(lease))
        .await;
    let guards: Vec<_> = stream::iter(0..n)
        .map(|i| {
            let reg = reg.clone();
            async move {
                let lock = reg.obtain(&format!("many{i}")).unwrap();
                // A stall of a loaded machine can make one try miss its deadline (Redlock gives
                // each node a tenth of the lease): a retryable error, retried as a caller
                // would. A try that finds the free key busy is not retried.
                let mut tries = 0;
                loop {
                    match lock.try_lock().await {
                        Err(e @ Error::Unavailable { .. }) if tries < 3 => {
                            tries += 1;
                            tracing::debug!(error = %e, "try of a free key retried");
                        }
                        other => break other.unwrap(),
                    }
                }
            }
        })
        .buffered(in_flight)
        .collect()
        .await;
    // Past the lease: only renewal can have kept them.
    tokio::time::sleep(lease + lease / 5).await;
    assert!(
        guards.iter().all(|g| g.is_held()),
        "some of {n} locks were not renewed (lease {lease:?})"
    );
    let other = h.registry().await;
    assert!(other
        .obtain(&format!("many{}", n - 1))
        .unwrap()
        .try_lock()
        .await
        .is_err());
    stream::iter(guards)
        .for_each_concurrent(in_flight, |g| async move { g.release().await.unwrap() })
        .await;
    crate::holds::free(&other, "many0", "free").await;
}

/// The lease of [`thousands_of_keys_at_once`], measured on the backend with a tenth of the
/// keys: long enough that one renewal round of all `n` keys (the largest batch the registry
/// can send), estimated as ten times that of the tenth, plus the slowest acquisition it may
/// queue behind (acquisitions go on while the first keys renew), takes at most a third of it.
/// The round is measured with the lease itself, since a backend may bound a request by a
/// share of it (Redlock gives each node a tenth), and the lease doubled until it passes.
/// Capped so that a very loaded machine makes the scenario slower, not endless.
async fn many_keys_lease(h: &Harness, n: usize, in_flight: usize) -> Duration {
    const MIN: Duration = Duration::from_millis(1500);
    const MAX: Duration = Duration::from_secs(30);
    let sample = n / 10;
    let backend = h.backend().await;
    let names: Vec<LockName> = (0..sample)
        .map(|i| LockName::new(h.prefix(), &format!("pace{i}")).unwrap())
        .collect();
    let held: Vec<(Token, Duration)> = stream::iter(&names)
        .map(|name| {
            let backend = &backend;
            async move {
                let token = Token::random();
                let request = AcquireRequest::new(name.clone(), token, Duration::from_secs(120));
                let started = Instant::now();
                match backend.acquire(&request).await.unwrap() {
                    Attempt::Acquired { .. } => (token, started.elapsed()),
                    other => panic!("a free key was not acquired: {other:?}"),
                }
            }
        })
        .buffered(in_flight)
        .collect()
        .await;
    let slowest = held.iter().map(|&(_, took)| took).max().unwrap_or_default();
    let mut lease = MIN;
    // A round that fails may leave keys with the short lease, to run out before the next: the
    // lease then doubles up to the cap, erring on the slow side.
    loop {
        let batch: Vec<Renewal> = names
            .iter()
            .zip(&held)
            .map(|(name, &(token, _))| Renewal {
                name: name.clone(),
                token,
                lease,
            })
            .collect();
        let started = Instant::now();
        let renewed = backend.extend_many(&batch).await;
        let round = started.elapsed() * (n / sample) as u32 + slowest;
        if lease >= MAX || (round * 3 <= lease && renewed.iter().all(|r| matches!(r, Ok(true)))) {
            break;
        }
        lease = (lease * 2).max(round * 3).min(MAX);
    }
    stream::iter(names.iter().zip(held))
        .for_each_concurrent(in_flight, |(name, (token, _))| {
            let backend = &backend;
            async move {
                let _ = backend.release(name, token).await;
            }
        })
        .await;
    lease
}

/// A queued busy attempt that reports its place (`Attempt::Busy::ahead`) counts the contenders
/// before it: the holder and the waiters queued earlier. Waiters poll by it, so a wrong count
/// would leave the head polling slowly.
pub async fn queued_places_count_the_contenders_before(h: &Harness) {
    let backend = h.backend().await;
    let name = LockName::new(h.prefix(), "places").unwrap();
    let lease = Duration::from_secs(10);
    let holder = Token::random();
    assert!(matches!(
        backend
            .acquire(&AcquireRequest::new(name.clone(), holder, lease))
            .await
            .unwrap(),
        Attempt::Acquired { .. }
    ));
    let (first, second) = (Token::random(), Token::random());
    let queued =
        |token| AcquireRequest::new(name.clone(), token, lease).with_mode(AcquireMode::Queue);
    for (token, place) in [(first, 1), (second, 2), (first, 1), (second, 2)] {
        match backend.acquire(&queued(token)).await.unwrap() {
            Attempt::Busy { ahead, .. } => assert!(
                ahead.is_none_or(|n| n == place),
                "{ahead:?} before a waiter with {place} contender(s) before it"
            ),
            other => panic!("a waiter behind a holder acquired: {other:?}"),
        }
    }
    for token in [second, first] {
        backend.leave_queue(&name, token).await.unwrap();
    }
    assert!(backend.release(&name, holder).await.unwrap().was_held);
}
