//! No Redis lock stays held by nobody: a hand-over to a waiter that died lapses within the
//! waiter ttl, the defaults leave a released key free for clients outside the queue, and the
//! status shows the holder's fence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::backends::redis::{RedisBackend, RedisOptions};
use distlock::{
    AcquireMode, AcquireRequest, Attempt, Backend, LockName, LockRegistry, RegistryOptions, Token,
};
use distlock_testkit::redis::RedisServer;
use distlock_testkit::timing::scheduling_slack;

async fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(&server.url()).await.expect("connect")
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).unwrap().parse().unwrap()
}

async fn acquired(backend: &RedisBackend, request: &AcquireRequest) -> u64 {
    match backend.acquire(request).await.unwrap() {
        Attempt::Acquired { fence } => fence,
        a => panic!("not acquired: {a:?}"),
    }
}

/// A waiter that queued and died (it never comes back for the lock) is handed the lock by the
/// release, but only for what is left of its place in the queue, not for its 30 s lease: the
/// key is free again within the waiter ttl, and the next client takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_to_a_dead_waiter_is_free_within_the_waiter_ttl() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let holder = backend(&server).await;
    let name = LockName::new("lock", "dead-waiter").unwrap();
    let lease = Duration::from_secs(30);
    let first = Token::random();
    acquired(&holder, &AcquireRequest::new(name.clone(), first, lease)).await;
    {
        let waiter = backend(&server).await;
        let queued =
            AcquireRequest::new(name.clone(), Token::random(), lease).with_mode(AcquireMode::Queue);
        assert!(matches!(
            waiter.acquire(&queued).await.unwrap(),
            Attempt::Busy { .. }
        ));
        // Dropped without leaving the queue: a process killed while it waited.
    }
    assert!(holder.release(&name, first).await.unwrap().was_held);
    let left = pttl(&server, "lock:dead-waiter");
    let ttl = RedisOptions::default().waiter_ttl;
    assert!(
        left > 0 && left <= ttl.as_millis() as i64,
        "the dead waiter was granted {left} ms, more than the waiter ttl {ttl:?}"
    );
    let released = Instant::now();
    let next = LockRegistry::from_backend(
        Arc::new(backend(&server).await) as Arc<dyn Backend>,
        RegistryOptions::default(),
    )
    .unwrap();
    let g = next
        .obtain("dead-waiter")
        .unwrap()
        .try_lock_for(Duration::from_secs(20))
        .await
        .expect("the lapsed grant frees the key");
    // The grant's lapse is noticed by the next poll (at most 500 ms apart on Redis).
    let bound = ttl + Duration::from_millis(500) + scheduling_slack().await;
    assert!(
        released.elapsed() <= bound,
        "taken after {:?}, bound {bound:?}",
        released.elapsed()
    );
    g.release().await.unwrap();
}

/// A live waiter with a lease longer than its place claims the short grant with its next
/// attempt, which sets its whole lease on the server and takes a fence above the releaser's;
/// the status then shows that fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_waiter_claims_its_grant_for_its_whole_lease() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let holder = backend(&server).await;
    let waiter = backend(&server).await;
    let name = LockName::new("lock", "claimed").unwrap();
    let (first, second) = (Token::random(), Token::random());
    let lease = Duration::from_secs(30);
    let f1 = acquired(&holder, &AcquireRequest::new(name.clone(), first, lease)).await;
    let mut sub = waiter.subscribe(&name, second).await.unwrap();
    let queued = AcquireRequest::new(name.clone(), second, lease).with_mode(AcquireMode::Queue);
    assert!(matches!(
        waiter.acquire(&queued).await.unwrap(),
        Attempt::Busy { .. }
    ));
    assert!(holder.release(&name, first).await.unwrap().was_held);
    tokio::time::timeout(Duration::from_secs(5), sub.released())
        .await
        .expect("the waiter is woken");
    assert_eq!(
        waiter.take_grant(&name, second),
        None,
        "a grant shorter than the lease is no hold until claimed"
    );
    assert!(pttl(&server, "lock:claimed") <= 2000);
    let f2 = acquired(&waiter, &queued).await;
    assert!(f2 > f1, "fence {f2} after {f1}");
    assert!(pttl(&server, "lock:claimed") > 20_000, "the whole lease");
    let info = waiter.inspect(&name).await.unwrap().expect("held");
    assert_eq!(info.fence, Some(f2));
    assert!(waiter.release(&name, second).await.unwrap().was_held);
}

/// Hold slices are opt-in: by default no release leaves a reservation that clients outside
/// the queue (a plain `SET NX`, a `try_lock`) would find busy.
#[test]
fn hold_slices_are_off_by_default() {
    assert_eq!(RedisOptions::default().hold_slice, Duration::ZERO);
}

/// Attempts that fail (a try, a plain `SET NX` client's) do not move the fence counter: the
/// status reports the fence the holder got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_shows_the_holders_fence_after_failed_tries() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let holder = backend(&server).await;
    let other = backend(&server).await;
    let name = LockName::new("lock", "status").unwrap();
    let lease = Duration::from_secs(30);
    let token = Token::random();
    let fence = acquired(&holder, &AcquireRequest::new(name.clone(), token, lease)).await;
    for _ in 0..3 {
        let attempt = other
            .acquire(&AcquireRequest::new(name.clone(), Token::random(), lease))
            .await
            .unwrap();
        assert!(matches!(attempt, Attempt::Busy { .. }));
    }
    let fresh = backend(&server).await;
    let attempt = fresh
        .acquire(&AcquireRequest::new(name.clone(), Token::random(), lease))
        .await
        .unwrap();
    assert!(matches!(attempt, Attempt::Busy { .. }));
    let info = fresh.inspect(&name).await.unwrap().expect("held");
    assert_eq!(info.fence, Some(fence), "the holder's fence");
    assert!(holder.release(&name, token).await.unwrap().was_held);
    let next = acquired(
        &other,
        &AcquireRequest::new(name.clone(), Token::random(), lease),
    )
    .await;
    assert!(next > fence, "fence {next} after {fence}");
}
