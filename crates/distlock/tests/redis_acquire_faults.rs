//! Acquisitions whose `SET` reached Redis but whose reply did not come back in time (delayed,
//! cut, or the future dropped): none of them may leave the key taken. Every lock here has a
//! lease of a minute, so a key that is only freed by its lease fails the test; every wait is
//! bounded by a multiple of the round trips measured through the fault proxy.

use std::sync::Arc;
use std::time::Duration;

use distlock::backends::redis::{RedisBackend, RedisOptions};
use distlock::{Backend, Error, LockRegistry, RegistryOptions};
use distlock_testkit::proxy::FaultProxy;
use distlock_testkit::redis::RedisServer;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(60);
/// The key as the registry names it, and as it is stored on the server.
const KEY: &str = "job";
const SERVER_KEY: &str = "acq:job";

async fn registry_with(url: &str, options: RedisOptions) -> LockRegistry {
    let backend: Arc<dyn Backend> = Arc::new(
        RedisBackend::connect_with(url, options)
            .await
            .expect("connect"),
    );
    LockRegistry::from_backend(
        backend,
        RegistryOptions::default()
            .with_prefix("acq")
            .with_lease(LEASE),
    )
    .unwrap()
}

async fn registry(url: &str) -> LockRegistry {
    registry_with(url, RedisOptions::default()).await
}

/// The longest of a few round trips through `proxy` (without added delay). Also loads the
/// scripts, so that an attempt is one round trip (not EVALSHA, NOSCRIPT, then EVAL).
async fn round_trip(reg: &LockRegistry) -> Duration {
    let lock = reg.obtain("probe").unwrap();
    lock.try_lock().await.unwrap().release().await.unwrap();
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        lock.inspect().await.unwrap();
        worst = worst.max(t.elapsed());
    }
    worst
}

/// A private Redis behind a fault proxy, a registry through the proxy, and the delay each way
/// that the tests add: `base` plus four of the round trips measured through the proxy.
async fn behind_a_proxy(base: Duration) -> (RedisServer, FaultProxy, LockRegistry, Duration) {
    let server = RedisServer::start().expect("redis-server must be installed");
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let reg = registry(&format!("redis://{}", proxy.addr())).await;
    let delay = base + round_trip(&reg).await * 4;
    (server, proxy, reg, delay)
}

/// Polls the server until the attempt's SET has landed, for at most `limit`.
async fn wait_for_the_set(server: &RedisServer, limit: Duration) {
    let until = Instant::now() + limit;
    while !key_exists(server) {
        assert!(Instant::now() < until, "the SET never reached the server");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn key_exists(server: &RedisServer) -> bool {
    server.cli(&["EXISTS", SERVER_KEY]).expect("EXISTS") == "1"
}

/// Polls the server until the key is gone, for at most `limit`; panics naming `what` if not.
async fn wait_until_free(server: &RedisServer, limit: Duration, what: &str) {
    let until = Instant::now() + limit;
    while key_exists(server) {
        if Instant::now() >= until {
            let ttl = server.cli(&["PTTL", SERVER_KEY]).unwrap_or_default();
            panic!("{what}: the key is still taken after {limit:?} (PTTL {ttl} ms)");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The SET reached the server, and the key is free again within ten `delay`s (the undo ran).
async fn set_landed_then_freed(server: &RedisServer, delay: Duration, after: &str) {
    assert!(key_exists(server), "the SET should have reached the server");
    wait_until_free(server, delay * 10 + Duration::from_secs(2), after).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_for_whose_deadline_passes_with_the_set_in_flight_leaves_the_key_free() {
    // Each way takes `delay`: the SET lands after one, its reply would come after two.
    let (server, proxy, reg, delay) = behind_a_proxy(Duration::from_millis(200)).await;
    proxy.set_delay(delay);
    let started = Instant::now();
    let r = reg
        .obtain(KEY)
        .unwrap()
        .try_lock_for(delay + delay / 2)
        .await;
    let waited = started.elapsed();
    assert!(
        matches!(r, Err(Error::NotAcquired { .. })),
        "the reply was due after the deadline, yet: {r:?}"
    );
    assert!(
        waited < delay * 2,
        "try_lock_for({:?}) waited {waited:?}: it waited for the late reply",
        delay + delay / 2
    );
    // The SET landed (after one delay); the release can only land after three. The attempt
    // finishes (reply after 2 delays), then the release goes out (1 more).
    set_landed_then_freed(&server, delay, "after try_lock_for timed out").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_cancelled_with_the_set_in_flight_leaves_the_key_free() {
    let (server, proxy, reg, delay) = behind_a_proxy(Duration::from_millis(200)).await;
    proxy.set_delay(delay);
    let lock = reg.obtain(KEY).unwrap();
    let r = tokio::time::timeout(delay + delay / 2, lock.lock()).await;
    assert!(r.is_err(), "the reply was due after the cancellation");
    // Meanwhile the SET landed: the key is ours on the server until the undo runs.
    set_landed_then_freed(&server, delay, "after a cancelled lock()").await;
    // And the registry that cancelled can take it again.
    proxy.set_delay(Duration::ZERO);
    let g = lock
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("free again");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_to_timeouts_leave_the_key_free_when_try_lock_for_gives_up() {
    // The backend gives up on a reply after `timeout`; the network takes `delay` each way, so
    // every attempt reaches the server and no reply makes it back in time.
    let (server, proxy, _probe, delay) = behind_a_proxy(Duration::from_millis(150)).await;
    let reg = registry_with(
        &format!("redis://{}", proxy.addr()),
        RedisOptions {
            response_timeout: delay + delay / 2,
            ..RedisOptions::default()
        },
    )
    .await;
    proxy.set_delay(delay);
    let lock = reg.obtain(KEY).unwrap();
    let attempt = tokio::spawn(async move { lock.try_lock_for(delay * 6).await });
    wait_for_the_set(&server, delay * 6).await;
    let r = attempt.await.unwrap();
    assert!(r.is_err(), "no reply came back in time, yet: {r:?}");
    wait_until_free(
        &server,
        delay * 10 + Duration::from_secs(2),
        "after every reply timed out",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_cut_reply_finds_its_own_key_and_acquires() {
    let (server, proxy, reg, delay) = behind_a_proxy(Duration::from_millis(200)).await;
    proxy.set_delay(delay);
    let lock = reg.obtain(KEY).unwrap();
    let attempt = tokio::spawn(async move { lock.try_lock_for(Duration::from_secs(20)).await });
    // Cut the connection once the SET landed and while its reply is held in the proxy.
    wait_for_the_set(&server, delay * 10).await;
    let token = server.cli(&["GET", SERVER_KEY]).unwrap();
    proxy.cut();
    proxy.set_delay(Duration::ZERO);
    proxy.restore();

    // The registry retries with the same token: that is its own lock, not a busy one.
    let started = Instant::now();
    let guard = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .expect("the retry must not wait for the lease")
        .unwrap()
        .expect("the retry finds its own token and acquires");
    assert_eq!(guard.token().to_string(), token);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "acquired only after {:?}",
        started.elapsed()
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert!(!key_exists(&server));
}
