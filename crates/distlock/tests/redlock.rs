//! Redlock over three independent `redis-server`s: the common `SET NX PX` layout on every
//! node, the majority rule both ways, a node down, a node restarted empty, and URL errors.

use std::time::{Duration, Instant};

use distlock::backends::redis::redlock::RedlockBackend;
use distlock::{Error, LockRegistry, RegistryOptions};
use distlock_testkit::redis::RedisServer;

fn nodes() -> Vec<RedisServer> {
    RedisServer::start_independent(3).expect("redis-server must be installed")
}

async fn registry(url: &str, options: RegistryOptions) -> LockRegistry {
    let backend = RedlockBackend::connect(url).await.expect("connect");
    LockRegistry::from_backend(std::sync::Arc::new(backend), options).unwrap()
}

/// Waits until `cond` holds, failing after `limit`: a condition, not a delay.
async fn eventually(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_set_nx_clients_and_distlock_exclude_each_other_by_majority() {
    let nodes = nodes();
    let reg = registry(
        &RedisServer::redlock_url(&nodes),
        RegistryOptions::default(),
    )
    .await;
    let lock = reg.obtain("job").unwrap();
    // A redsync-style client holds a majority: distlock cannot, and keeps nothing it won.
    for n in &nodes[..2] {
        assert_eq!(
            n.cli(&["SET", "lock:job", "foreign", "NX", "PX", "60000"])
                .unwrap(),
            "OK"
        );
    }
    assert!(matches!(
        lock.try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
    assert_eq!(nodes[2].cli(&["EXISTS", "lock:job"]).unwrap(), "0");
    // The foreign client holds one node only: a majority is left for distlock.
    nodes[1].cli(&["DEL", "lock:job"]).unwrap();
    let g = lock.try_lock().await.expect("two of three nodes are free");
    let token = g.token().to_string();
    assert_eq!(nodes[1].cli(&["GET", "lock:job"]).unwrap(), token);
    assert_eq!(nodes[2].cli(&["GET", "lock:job"]).unwrap(), token);
    // The set keys outlive the lease by the drift allowance, never fall short of it.
    let pttl: u64 = nodes[1]
        .cli(&["PTTL", "lock:job"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(pttl > 30_000, "PTTL {pttl} ms for a 30 s lease");
    g.release().await.unwrap();
    nodes[0].cli(&["DEL", "lock:job"]).unwrap();
    // distlock holds: a SET NX client finds every node taken.
    let g = lock.lock().await.unwrap();
    for n in &nodes {
        assert_ne!(
            n.cli(&["SET", "lock:job", "foreign", "NX", "PX", "60000"])
                .unwrap(),
            "OK"
        );
    }
    g.release().await.unwrap();
    for n in &nodes {
        assert_eq!(n.cli(&["EXISTS", "lock:job"]).unwrap(), "0");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_survives_a_node_down_and_is_lost_without_a_majority() {
    let mut nodes = nodes();
    let url = RedisServer::redlock_url(&nodes);
    let lease = Duration::from_millis(900);
    let reg = registry(&url, RegistryOptions::default().with_lease(lease)).await;
    let other = registry(&url, RegistryOptions::default()).await;
    let g = reg.obtain("job").unwrap().lock().await.unwrap();
    nodes[0].kill();
    // Three leases with one node down: renewals on the other two keep the hold.
    tokio::time::sleep(lease * 3).await;
    assert!(g.is_held(), "two of three nodes still hold the key");
    assert!(other.obtain("job").unwrap().try_lock().await.is_err());
    nodes[1].kill();
    tokio::time::timeout(lease * 4, g.lost())
        .await
        .expect("the hold is lost without a majority");
    assert!(!g.is_held());
    match other.obtain("job").unwrap().try_lock().await {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("one node of three left: expected Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_gets_the_key_back_at_the_next_renewal() {
    let mut nodes = nodes();
    let url = RedisServer::redlock_url(&nodes);
    let lease = Duration::from_millis(900);
    let reg = registry(&url, RegistryOptions::default().with_lease(lease)).await;
    let g = reg.obtain("job").unwrap().lock().await.unwrap();
    let token = g.token().to_string();
    nodes[2].restart().unwrap();
    assert_eq!(nodes[2].cli(&["EXISTS", "lock:job"]).unwrap(), "0");
    let node = &nodes[2];
    eventually(lease * 4, "the restarted node holds the key again", || {
        node.cli(&["GET", "lock:job"]).ok().as_deref() == Some(token.as_str())
    })
    .await;
    assert!(g.is_held());
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_on_a_majority_is_lost_not_taken_back() {
    let nodes = nodes();
    let url = RedisServer::redlock_url(&nodes);
    let lease = Duration::from_millis(900);
    let reg = registry(&url, RegistryOptions::default().with_lease(lease)).await;
    let g = reg.obtain("job").unwrap().lock().await.unwrap();
    for n in &nodes[..2] {
        n.cli(&["DEL", "lock:job"]).unwrap();
    }
    tokio::time::timeout(lease * 4, g.lost())
        .await
        .expect("the hold is lost");
    for n in &nodes[..2] {
        assert_eq!(n.cli(&["EXISTS", "lock:job"]).unwrap(), "0");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_and_unreachable_nodes_give_clear_errors() {
    for (url, part) in [
        ("redlock://127.0.0.1:1,127.0.0.1:2", "at least three"),
        ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?x=1", "query"),
        ("redlock://127.0.0.1:1,,127.0.0.1:3", "empty host"),
        ("redlock://127.0.0.1:1,127.0.0.1:x,127.0.0.1:3", "port"),
    ] {
        match RedlockBackend::connect(url).await {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(part), "{url}: {msg}"),
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }
    let mut nodes = nodes();
    nodes[0].kill();
    let url = RedisServer::redlock_url(&nodes);
    let backend = RedlockBackend::connect(&url)
        .await
        .expect("two of three nodes answer");
    assert_eq!(backend.quorum(), 2);
    nodes[1].kill();
    match RedlockBackend::connect(&url).await {
        Err(Error::Unavailable { message, .. }) => {
            assert!(message.contains("only 1 of 3"), "{message}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// The server's clock in ms on `node`.
fn now_ms(node: &RedisServer) -> u64 {
    let t = node.cli(&["TIME"]).unwrap();
    let mut parts = t.lines().map(|p| p.parse::<u64>().unwrap());
    parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_holds_rest_on_a_majority_and_come_back_on_a_restarted_node() {
    let mut nodes = nodes();
    let url = RedisServer::redlock_url(&nodes);
    let lease = Duration::from_millis(900);
    let reg = registry(&url, RegistryOptions::default().with_lease(lease)).await;
    let r = reg.read_write("doc").unwrap().read().lock().await.unwrap();
    let token = r.token().to_string();
    for n in &nodes {
        assert_eq!(n.cli(&["HGET", "lock:doc", &token]).unwrap(), "1");
        assert_eq!(
            n.cli(&["SET", "lock:doc", "foreign", "NX", "PX", "5000"])
                .unwrap(),
            "(nil)",
            "a SET NX client beside a reader"
        );
    }
    let other = registry(&url, RegistryOptions::default()).await;
    let shared = other.read_write("doc").unwrap().read().try_lock().await;
    let shared = shared.expect("readers share on every node");
    assert!(matches!(
        other.read_write("doc").unwrap().write().try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
    shared.release().await.unwrap();
    nodes[2].restart().unwrap();
    let node = &nodes[2];
    eventually(lease * 4, "the restarted node has the reader again", || {
        node.cli(&["HGET", "lock:doc", &token]).ok().as_deref() == Some("1")
    })
    .await;
    assert!(r.is_held());
    r.release().await.unwrap();
    for n in &nodes {
        assert_eq!(n.cli(&["EXISTS", "lock:doc"]).unwrap(), "0");
    }
}

/// Permits counted per node could admit more holders than permits: holder A on nodes 0 and 1,
/// B on nodes 1 and 2, and a third with a free permit on nodes 0 and 2. A permit therefore
/// needs the same slot on a majority, which the third cannot have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_needs_one_slot_on_a_majority_so_holders_never_outnumber_permits() {
    let nodes = nodes();
    let url = RedisServer::redlock_url(&nodes);
    let (a, b) = ("a".repeat(32), "b".repeat(32));
    let place = |n: &RedisServer, token: &str, slot: u32| {
        let value = format!("{}:{slot}", now_ms(n) + 60_000);
        n.cli(&[
            "HSET",
            "lock:pool",
            "mode",
            "semaphore",
            "permits",
            "2",
            token,
            &value,
        ])
        .unwrap();
        n.cli(&["PEXPIRE", "lock:pool", "60000"]).unwrap();
    };
    place(&nodes[0], &a, 0);
    place(&nodes[1], &a, 0);
    place(&nodes[1], &b, 1);
    place(&nodes[2], &b, 1);
    let lease = Duration::from_millis(900);
    let reg = registry(&url, RegistryOptions::default().with_lease(lease)).await;
    let sem = reg.semaphore("pool", 2).unwrap();
    assert!(
        matches!(sem.try_lock().await, Err(Error::NotAcquired { .. })),
        "a third holder of two permits"
    );
    for (n, left) in [(&nodes[0], 3), (&nodes[1], 4), (&nodes[2], 3)] {
        assert_eq!(
            n.cli(&["HLEN", "lock:pool"]).unwrap(),
            left.to_string(),
            "the refused attempt left a permit behind"
        );
    }
    // B leaves: slot 1 is free on nodes 0 and 1; node 2, now empty, offers slot 0, which the
    // attempt gives back there, and the next renewal sets it in slot 1.
    for n in &nodes[1..] {
        n.cli(&["HDEL", "lock:pool", &b]).unwrap();
    }
    let g = sem.try_lock().await.expect("slot 1 on a majority");
    let token = g.token().to_string();
    for n in &nodes[..2] {
        let v = n.cli(&["HGET", "lock:pool", &token]).unwrap();
        assert!(v.ends_with(":1"), "slot of the new permit: {v}");
    }
    let node = &nodes[2];
    eventually(lease * 4, "node 2 gets the permit in slot 1", || {
        node.cli(&["HGET", "lock:pool", &token])
            .is_ok_and(|v| v.ends_with(":1"))
    })
    .await;
    assert!(g.is_held());
    g.release().await.unwrap();
}

/// A mutex that waited leaves its place in every node's queue when it gets the lock: a reader
/// of the key is not kept out after the mutex is released (the place would otherwise stay for
/// the waiter ttl, as if an exclusive waiter still waited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_that_waited_leaves_the_queue_when_it_gets_the_lock() {
    let nodes = nodes();
    let url = RedisServer::redlock_url(&nodes);
    let holder = registry(&url, RegistryOptions::default()).await;
    let waiter = registry(&url, RegistryOptions::default()).await;
    let g = holder.obtain("q").unwrap().lock().await.unwrap();
    let lock = waiter.obtain("q").unwrap();
    let waiting = tokio::spawn(async move { lock.lock().await });
    eventually(
        Duration::from_secs(10),
        "the mutex queues on every node",
        || {
            nodes
                .iter()
                .all(|n| n.cli(&["ZCARD", "{lock:q}:queue"]).ok().as_deref() == Some("1"))
        },
    )
    .await;
    g.release().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    for n in &nodes {
        assert_eq!(n.cli(&["ZCARD", "{lock:q}:queue"]).unwrap(), "0");
    }
    w.release().await.unwrap();
    let reader = holder.read_write("q").unwrap().read().try_lock().await;
    reader
        .expect("no exclusive waiter is left")
        .release()
        .await
        .unwrap();
}
