//! The Redis wire layout as other clients see it: Spring's release channels, the plain
//! `SET NX PX` protocol, and the fair queue between distlock processes.

mod common {
    pub mod fifo;
}

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fifo::spawn_waiter;
use distlock::backends::redis::{RedisBackend, RedisOptions};
use distlock::{
    AcquireMode, AcquireRequest, Attempt, Backend, LockName, LockRegistry, RegistryOptions, Token,
};
use distlock_testkit::redis::RedisServer;
use futures_util::StreamExt;

async fn registry(url: &str) -> LockRegistry {
    let backend: Arc<dyn Backend> = Arc::new(RedisBackend::connect(url).await.expect("connect"));
    LockRegistry::from_backend(backend, RegistryOptions::default()).unwrap()
}

/// Releases `voucher:42` through a registry on `url` and returns the first message seen on
/// each Spring channel, after which a marker is published on both: a channel the release did
/// not publish on yields the marker.
async fn spring_messages_of_a_release(server: &RedisServer, url: &str) -> Vec<(String, String)> {
    let client = redis::Client::open(server.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    let channels = ["lock-channel", "lock-channel:lock:voucher:42"];
    for c in channels {
        pubsub.subscribe(c).await.unwrap();
    }
    let reg = registry(url).await;
    let g = reg.obtain("voucher:42").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    for c in channels {
        server.cli(&["PUBLISH", c, "marker"]).unwrap();
    }
    let mut first = std::collections::BTreeMap::new();
    let mut stream = pubsub.on_message();
    while first.len() < channels.len() {
        let msg = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("a message on each channel")
            .unwrap();
        first
            .entry(msg.get_channel_name().to_owned())
            .or_insert(msg.get_payload::<String>().unwrap());
    }
    first.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_publishes_the_key_on_the_spring_channel_of_the_lock() {
    let server = RedisServer::start().expect("redis-server must be installed");
    assert_eq!(
        spring_messages_of_a_release(&server, &server.url()).await,
        vec![
            ("lock-channel".to_owned(), "marker".to_owned()),
            (
                "lock-channel:lock:voucher:42".to_owned(),
                "lock:voucher:42".to_owned()
            ),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_publishes_the_key_on_both_spring_channels_when_asked() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let url = format!("{}?spring_legacy_channel=true", server.url());
    assert_eq!(
        spring_messages_of_a_release(&server, &url).await,
        vec![
            ("lock-channel".to_owned(), "lock:voucher:42".to_owned()),
            (
                "lock-channel:lock:voucher:42".to_owned(),
                "lock:voucher:42".to_owned()
            ),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_release_message_wakes_a_waiter_before_its_poll() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url()).await;
    for channel in ["lock-channel", "lock-channel:lock:job"] {
        assert_eq!(
            server
                .cli(&["SET", "lock:job", "spring-client", "NX", "PX", "10000"])
                .unwrap(),
            "OK"
        );
        let lock = reg.obtain("job").unwrap();
        let waiter = tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // What a Spring client does on unlock: delete, then publish the key.
        let released = Instant::now();
        server.cli(&["DEL", "lock:job"]).unwrap();
        server.cli(&["PUBLISH", channel, "lock:job"]).unwrap();
        let acquired = tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .unwrap()
            .unwrap();
        let reaction = acquired - released;
        // The fallback poll would take at least 100 ms; a message is much faster.
        assert!(
            reaction < Duration::from_millis(80),
            "{channel}: woken after {reaction:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_different_processes_are_served_in_arrival_order() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let holder = registry(&server.url()).await;
    let g = holder.obtain("fifo").unwrap().lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let reg = registry(&server.url()).await; // one registry per "process"
        tasks.push(spawn_waiter(
            reg,
            "fifo",
            i,
            &order,
            Duration::from_millis(10),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The holder comes back at once after releasing: it must queue behind the others.
    g.release().await.unwrap();
    let again = holder.obtain("fifo").unwrap().lock().await.unwrap();
    order.lock().unwrap().push(99);
    again.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 99]);
}

/// A release with a distlock waiter queued hands the lock to that waiter: at no moment is it
/// free for a plain `SET NX PX` client or a `try_lock` arriving later, which is what lets an
/// uncontended attempt skip the queue check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_first_waiter_not_to_a_later_arrival() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let holder = registry(&server.url()).await;
    let waiter = registry(&server.url()).await;
    let barger = registry(&server.url()).await;
    for round in 0..20 {
        let g = holder.obtain("handoff").unwrap().lock().await.unwrap();
        let first_fence = g.fence();
        let lock = waiter.obtain("handoff").unwrap();
        let waiting = tokio::spawn(async move { lock.lock().await.unwrap() });
        queued(&server, "handoff", 1).await;
        g.release().await.unwrap();
        let set = server
            .cli(&["SET", "lock:handoff", "foreign", "NX", "PX", "60000"])
            .unwrap();
        assert_ne!(set, "OK", "round {round}: a SET NX client took the lock");
        assert!(
            barger.obtain("handoff").unwrap().try_lock().await.is_err(),
            "round {round}: a later try_lock took the lock"
        );
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiter gets the lock")
            .unwrap();
        assert!(got.fence() > first_fence);
        got.release().await.unwrap();
    }
}

/// A backend whose waiters keep their places for a minute: a release grants them their whole
/// lease (up to that), which they take without a round trip.
async fn patient_waiter(server: &RedisServer) -> RedisBackend {
    let options = RedisOptions {
        waiter_ttl: Duration::from_secs(60),
        ..RedisOptions::default()
    };
    RedisBackend::connect_with(&server.url(), options)
        .await
        .expect("connect")
}

/// The hand-over on the wire: the release sets the lock to the queued waiter's token with the
/// waiter's lease (its place lasts longer) and tells it the fence, so the waiter holds the lock
/// without an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_lock_and_its_fence_to_the_head_waiter() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let holder = RedisBackend::connect(&server.url()).await.expect("connect");
    let waiter = patient_waiter(&server).await;
    let name = LockName::new("lock", "granted").unwrap();
    let (first, second) = (Token::random(), Token::random());
    let lease = Duration::from_secs(30);
    let Attempt::Acquired { fence: f1 } = holder
        .acquire(&AcquireRequest::new(name.clone(), first, lease))
        .await
        .unwrap()
    else {
        panic!("a free lock is acquired")
    };
    let mut sub = waiter.subscribe(&name, second).await.unwrap();
    assert!(matches!(
        waiter
            .acquire(
                &AcquireRequest::new(name.clone(), second, Duration::from_secs(20))
                    .with_mode(AcquireMode::Queue),
            )
            .await
            .unwrap(),
        Attempt::Busy { .. }
    ));
    assert_eq!(
        waiter.take_grant(&name, second),
        None,
        "nothing granted yet"
    );
    assert!(!holder.expects_busy(&name), "nothing handed over yet");
    assert!(holder.release(&name, first).await.unwrap().was_held);
    // The holder knows it gave the lock away: its next blocking acquisition queues at once.
    assert!(holder.expects_busy(&name));
    assert!(!waiter.expects_busy(&name));
    tokio::time::timeout(Duration::from_secs(5), sub.released())
        .await
        .expect("the waiter is woken");
    let f2 = waiter
        .take_grant(&name, second)
        .expect("the lock was granted");
    assert!(f2 > f1, "fence {f2} after {f1}");
    assert_eq!(waiter.take_grant(&name, second), None, "taken once");
    assert_eq!(
        server.cli(&["GET", "lock:granted"]).unwrap(),
        second.to_string()
    );
    let pttl: u64 = server
        .cli(&["PTTL", "lock:granted"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        pttl > 10_000 && pttl <= 20_000,
        "the waiter's lease, got {pttl} ms"
    );
    let info = waiter.inspect(&name).await.unwrap().expect("held");
    assert_eq!(info.fence, Some(f2));
    assert!(waiter.release(&name, second).await.unwrap().was_held);
}

/// A hand-over the waiter did not take before its lease ran out (its process was stopped) is
/// void once the lock has moved on: the waiter's next attempt finds the lock busy, and the old
/// grant, whether its message came before that busy reply or after it, is not taken. Taking it
/// would make a guard counted from the busy attempt, with a fence lower than the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_from_before_a_busy_attempt_is_not_taken() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let holder = RedisBackend::connect(&server.url()).await.expect("connect");
    let waiter = patient_waiter(&server).await;
    let name = LockName::new("lock", "late").unwrap();
    let (first, second, third) = (Token::random(), Token::random(), Token::random());
    let queued =
        |lease| AcquireRequest::new(name.clone(), second, lease).with_mode(AcquireMode::Queue);
    // Every wake message, as the waiter's pub/sub connection receives it.
    let mut monitor = redis::Client::open(server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    monitor.psubscribe("lock-wake:*").await.unwrap();
    let mut wakes = monitor.on_message();

    assert!(matches!(
        holder
            .acquire(&AcquireRequest::new(
                name.clone(),
                first,
                Duration::from_secs(30)
            ))
            .await
            .unwrap(),
        Attempt::Acquired { .. }
    ));
    let mut sub = waiter.subscribe(&name, second).await.unwrap();
    let busy = waiter.acquire(&queued(Duration::from_millis(300))).await;
    assert!(matches!(busy.unwrap(), Attempt::Busy { .. }));
    assert!(holder.release(&name, first).await.unwrap().was_held);
    let wake = tokio::time::timeout(Duration::from_secs(5), wakes.next())
        .await
        .expect("the release hands the lock over")
        .unwrap();
    let (channel, payload) = (
        wake.get_channel_name().to_owned(),
        wake.get_payload::<String>().unwrap(),
    );
    tokio::time::timeout(Duration::from_secs(5), sub.released())
        .await
        .expect("the waiter is woken");
    // The waiter does not take its grant: its hand-over's lease runs out and another client
    // takes the lock.
    while server.cli(&["EXISTS", "lock:late"]).unwrap() != "0" {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Attempt::Acquired { fence: taken } = holder
        .acquire(&AcquireRequest::new(
            name.clone(),
            third,
            Duration::from_secs(30),
        ))
        .await
        .unwrap()
    else {
        panic!("the lapsed hand-over leaves the lock free")
    };
    let busy = waiter.acquire(&queued(Duration::from_secs(30))).await;
    assert!(matches!(busy.unwrap(), Attempt::Busy { .. }));
    assert_eq!(
        waiter.take_grant(&name, second),
        None,
        "a grant whose message came before the busy reply"
    );
    // The same message delivered after the busy reply, as a lagging connection would.
    server.cli(&["PUBLISH", &channel, &payload]).unwrap();
    tokio::time::timeout(Duration::from_secs(5), sub.released())
        .await
        .expect("the late message wakes the waiter");
    assert_eq!(
        waiter.take_grant(&name, second),
        None,
        "a grant whose message came after the busy reply"
    );
    // A hand-over after the busy attempt is taken, with a fence above the holder's.
    assert!(holder.release(&name, third).await.unwrap().was_held);
    tokio::time::timeout(Duration::from_secs(5), sub.released())
        .await
        .expect("the waiter is woken");
    let fence = waiter
        .take_grant(&name, second)
        .expect("the new hand-over is the waiter's");
    assert!(fence > taken, "fence {fence} after {taken}");
    assert!(waiter.release(&name, second).await.unwrap().was_held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_does_not_hold_up_the_queue() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let holder = registry(&server.url()).await;
    let quitter = registry(&server.url()).await;
    let patient = registry(&server.url()).await;
    let g = holder.obtain("q").unwrap().lock().await.unwrap();
    let quitter_lock = quitter.obtain("q").unwrap();
    let gave_up = quitter_lock.try_lock_for(Duration::from_millis(200));
    let patient_lock = patient.obtain("q").unwrap();
    let waiting =
        tokio::spawn(async move { patient_lock.lock().await.map(|g| (Instant::now(), g)) });
    assert!(gave_up.await.is_err());
    // A cancelled waiter leaves too.
    let cancelled = quitter.obtain("q").unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(100), cancelled.lock()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    g.release().await.unwrap();
    let (at, g2) = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        at - released < Duration::from_millis(200),
        "queue held up for {:?}",
        at - released
    );
    g2.release().await.unwrap();
}

/// An operator's forced release removes any holder's key (here a plain `SET NX PX` client's),
/// tells Spring's waiters as a release does, and keeps the fence counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_deletes_any_holder_and_publishes() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    let name = LockName::new("lock", "forced").unwrap();
    let reg = registry(&server.url()).await;
    let first = reg.obtain("forced").unwrap().lock().await.unwrap();
    let fence = first.fence();
    first.release().await.unwrap();
    server
        .cli(&["SET", "lock:forced", "foreign", "NX", "PX", "60000"])
        .expect("SET");
    let client = redis::Client::open(server.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("lock-channel:lock:forced").await.unwrap();
    assert!(backend.force_release(&name).await.unwrap());
    let msg = tokio::time::timeout(Duration::from_secs(2), pubsub.on_message().next())
        .await
        .expect("release message")
        .unwrap();
    assert_eq!(msg.get_payload::<String>().unwrap(), "lock:forced");
    assert!(!backend.force_release(&name).await.unwrap(), "already free");
    let next = reg.obtain("forced").unwrap().try_lock().await.unwrap();
    assert!(next.fence() > fence, "the fence counter was kept");
    next.release().await.unwrap();
}

/// Waits until the key's wait queue has `n` members (a condition, not a delay).
async fn queued(server: &RedisServer, key: &str, n: usize) {
    let since = Instant::now();
    while server
        .cli(&["ZCARD", &format!("{{lock:{key}}}:queue")])
        .unwrap()
        != n.to_string()
    {
        assert!(since.elapsed() < Duration::from_secs(10), "never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `looper` gets the contended key `key` from the queue right after releasing it (its slice
/// begins), with `waiter` queued behind it; returns the looper's guard and the waiter's task, which records when it
/// got the lock.
async fn a_slice_with_a_waiter(
    server: &RedisServer,
    looper: &LockRegistry,
    waiter: &LockRegistry,
    key: &'static str,
) -> (
    distlock::LockGuard,
    tokio::task::JoinHandle<(Instant, u64)>,
    Instant,
) {
    // The looper takes the key again right after a release (which hands it to the waiter):
    // it takes the key in a loop, so its releases in the slice will reserve it.
    let lock = looper.obtain(key).unwrap();
    let g = lock.lock().await.unwrap();
    let taking = waiter.obtain(key).unwrap();
    let taking = tokio::spawn(async move { taking.lock().await.unwrap() });
    queued(server, key, 1).await;
    g.release().await.unwrap();
    let started = Instant::now();
    let looping = tokio::spawn(async move { lock.lock().await.unwrap() });
    let first = taking.await.unwrap();
    queued(server, key, 1).await;
    first.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), looping)
        .await
        .expect("the looper is served")
        .unwrap();
    let lock = waiter.obtain(key).unwrap();
    let waiting = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        let got = (Instant::now(), g.fence());
        g.release().await.unwrap();
        got
    });
    queued(server, key, 1).await;
    (g, waiting, started)
}

/// Within its slice, a backend that got a contended lock and takes it again right after each
/// release keeps it: each release leaves the key reserved for it (`~<instance>`), the waiter
/// stays queued, and each acquisition still takes a new, higher fence. Once the looper stops,
/// the waiter gets the lock when the reservation runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_holder_keeps_a_contended_lock_for_its_slice() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let slice = Duration::from_millis(900);
    let looper = registry(&format!("{}?hold_slice=900ms", server.url())).await;
    let waiter = registry(&server.url()).await;
    let (mut g, waiting, started) = a_slice_with_a_waiter(&server, &looper, &waiter, "slice").await;
    let lock = looper.obtain("slice").unwrap();
    let mut cycles = 0;
    // The slice began after `started`: half of it measured from there is surely inside it.
    while started.elapsed() < slice / 2 {
        let fence = g.fence();
        g.release().await.unwrap();
        let value = server.cli(&["GET", "lock:slice"]).unwrap();
        assert!(
            value.starts_with('~'),
            "not reserved after a release: {value:?}"
        );
        g = lock.lock().await.unwrap();
        assert!(g.fence() > fence, "fence {} after {fence}", g.fence());
        cycles += 1;
        assert!(!waiting.is_finished(), "the waiter got in within the slice");
        assert_eq!(
            server.cli(&["ZCARD", "{lock:slice}:queue"]).unwrap(),
            "1",
            "the waiter lost its place"
        );
    }
    assert!(cycles >= 1, "no cycle within the slice");
    let last = g.fence();
    let released = Instant::now();
    g.release().await.unwrap();
    // Reserved, or already the waiter's: never free for a client outside the queue.
    let set = server
        .cli(&["SET", "lock:slice", "foreign", "NX", "PX", "60000"])
        .unwrap();
    assert_ne!(set, "OK", "a SET NX client took the reserved lock");
    let (at, fence) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter gets the lock once the reservation runs out")
        .unwrap();
    assert!(at > released && fence > last, "fence {fence} after {last}");
}

/// At the end of its slice the looper's release hands the lock to the waiter, and the
/// looper's next acquisition queues behind it; with `hold_slice=0`, the default, that happens
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_slice_a_looping_holder_queues_behind_the_waiter() {
    let server = RedisServer::start().expect("redis-server must be installed");
    for (url, key) in [
        (format!("{}?hold_slice=0ms", server.url()), "strict"),
        (server.url(), "default"),
        (format!("{}?hold_slice=50ms", server.url()), "short"),
    ] {
        let looper = registry(&url).await;
        let waiter = registry(&server.url()).await;
        let (mut g, waiting, _) = a_slice_with_a_waiter(&server, &looper, &waiter, key).await;
        let lock = looper.obtain(key).unwrap();
        // The waiter's fence lies between the looper's last fence before it and the first
        // after it: that tells in which cycle the lock went to the waiter.
        let mut fences = vec![g.fence()];
        let waiter_fence = loop {
            g.release().await.unwrap();
            g = tokio::time::timeout(Duration::from_secs(10), lock.lock())
                .await
                .expect("the looper gets the lock back")
                .unwrap();
            fences.push(g.fence());
            if waiting.is_finished() {
                break waiting.await.unwrap().1;
            }
            assert!(fences.len() < 100_000, "{key}: the waiter is never served");
        };
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
        let cycle = fences.iter().position(|&f| f > waiter_fence);
        assert!(
            cycle.is_some_and(|c| c >= 1),
            "{key}: waiter fence {waiter_fence} outside the looper's {fences:?}"
        );
        if key != "short" {
            assert_eq!(
                cycle,
                Some(1),
                "without a slice the first release hands the lock over"
            );
        }
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_hold_slice_longer_than_half_the_waiter_ttl_is_refused() {
    for q in ["hold_slice=1500ms", "hold_slice=soon"] {
        let err = RedisBackend::connect(&format!("redis://127.0.0.1:1/?{q}"))
            .await
            .expect_err(q);
        assert!(
            matches!(err, distlock::Error::InvalidConfig(_)),
            "{q}: {err}"
        );
    }
}

/// A queued busy attempt tells the waiter its place (the holder and the waiters before it) and
/// asks it back within half the waiter ttl, which keeps its place; a try has no place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_busy_attempt_reports_its_place_and_the_time_to_keep_it() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    let name = LockName::new("lock", "places").unwrap();
    let lease = Duration::from_secs(30);
    let request = |token| AcquireRequest::new(name.clone(), token, lease);
    assert!(matches!(
        backend.acquire(&request(Token::random())).await.unwrap(),
        Attempt::Acquired { .. }
    ));
    let queued = |token| request(token).with_mode(AcquireMode::Queue);
    let (first, second) = (Token::random(), Token::random());
    let keep = RedisOptions::default().waiter_ttl / 2;
    for (token, place) in [(first, 1), (second, 2), (first, 1), (second, 2)] {
        match backend.acquire(&queued(token)).await.unwrap() {
            Attempt::Busy {
                retry_after: Some(r),
                ahead: Some(ahead),
            } => {
                assert_eq!(ahead, place, "contenders before the waiter");
                assert!(r <= keep, "back within {keep:?}, not {r:?}");
            }
            other => panic!("a queued waiter behind a holder is busy with a place: {other:?}"),
        }
    }
    match backend.acquire(&request(Token::random())).await.unwrap() {
        Attempt::Busy { ahead, .. } => assert_eq!(ahead, None, "a try has no place"),
        other => panic!("a held lock is busy: {other:?}"),
    }
}

/// `max_connections=2`: however many lock calls run at once, the server is never asked for
/// more than two connections of the lock path (they wait in line and share writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_bounds_the_connections_a_backend_opens() {
    let server = RedisServer::start().expect("redis-server must be installed");
    // Counts from here: the server's start-up checks are not the backend's.
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    let reg = registry(&format!("{}?max_connections=2", server.url())).await;
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let reg = reg.clone();
            tokio::spawn(async move {
                for round in 0..3 {
                    let g = reg
                        .obtain(&format!("bounded:{i}:{round}"))
                        .unwrap()
                        .try_lock()
                        .await
                        .unwrap();
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let info = server.cli(&["INFO", "stats"]).unwrap();
    let opened: usize = info
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_connections_received");
    // The backend's two, and the one `INFO` came on.
    assert!(opened <= 3, "{opened} connections for 1,800 lock calls");
    assert!(opened >= 2, "{opened}: the backend opened none");
}
