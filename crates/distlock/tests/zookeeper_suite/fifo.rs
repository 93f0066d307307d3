//! The queue: predecessor-only watches, arrival order across registries, no node left by a
//! waiter that gives up, fences that keep increasing after the parent is reaped.

use super::*;

/// Five waiters queue behind a holder; each release wakes exactly the next one (no herd), and
/// the lock goes round in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_waiter_watches_only_its_predecessor() {
    let server = shared();
    let url = format!("{}{}", server.url(), root());
    let lease = Duration::from_secs(30);
    let name = LockName::new("lock", "herd").unwrap();
    let holder = backend(&url).await;
    let first = Token::random();
    assert!(matches!(
        queued_attempt(&*holder, &name, first, lease).await,
        Attempt::Acquired { .. }
    ));
    let mut waiters = Vec::new();
    for _ in 0..5 {
        let b = backend(&url).await;
        let t = Token::random();
        let sub = b.subscribe(&name, t).await.unwrap();
        assert!(matches!(
            queued_attempt(&*b, &name, t, lease).await,
            Attempt::Busy { .. }
        ));
        waiters.push((b, t, sub));
    }
    let mut prev: (Arc<ZooKeeperBackend>, Token) = (holder, first);
    let mut last_fence = 0;
    for i in 0..waiters.len() {
        assert!(prev.0.release(&name, prev.1).await.unwrap().was_held);
        // Exactly waiter i is woken ...
        timeout(Duration::from_secs(2), waiters[i].2.released())
            .await
            .unwrap_or_else(|_| panic!("waiter {i} not woken by its predecessor's release"));
        let (b, t) = (waiters[i].0.clone(), waiters[i].1);
        match queued_attempt(&*b, &name, t, lease).await {
            Attempt::Acquired { fence } => {
                assert!(fence > last_fence);
                last_fence = fence;
            }
            other => panic!("waiter {i} woken but {other:?}"),
        }
        // ... and no one behind it.
        for (j, w) in waiters.iter_mut().enumerate().skip(i + 1) {
            assert!(
                timeout(Duration::from_millis(100), w.2.released())
                    .await
                    .is_err(),
                "waiter {j} woken by a release that was not its predecessor's (herd)"
            );
        }
        prev = (b, t);
    }
    assert!(prev.0.release(&name, prev.1).await.unwrap().was_held);
    assert!(prev.0.inspect(&name).await.unwrap().is_none());
}

/// Waiters of different registries (processes) get the lock in the order they asked for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_waiters_are_served_in_arrival_order() {
    let server = shared();
    let url = format!("{}{}", server.url(), root());
    let holder = registry(&backend(&url).await, RegistryOptions::default());
    let g = holder.obtain("fifo").unwrap().lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let reg = registry(&backend(&url).await, RegistryOptions::default());
        tasks.push(spawn_waiter(
            reg,
            "fifo",
            i,
            &order,
            Duration::from_millis(5),
        ));
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    g.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(10), t).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
}

/// A waiter that gives up (timeout or cancellation) leaves no node in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_no_node_behind() {
    let server = shared();
    let url = format!("{}{}", server.url(), root());
    let a = backend(&url).await;
    let g = registry(&a, RegistryOptions::default())
        .obtain("c")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let b = backend(&url).await;
    let breg = registry(&b, RegistryOptions::default());
    let name = LockName::new("lock", "c").unwrap();
    // Gives up by deadline, then by being dropped, at many points of its attempt.
    assert!(breg
        .obtain("c")
        .unwrap()
        .try_lock_for(Duration::from_millis(150))
        .await
        .is_err());
    for i in 0..30u64 {
        let _ = timeout(
            Duration::from_micros(200 * i),
            breg.obtain("c").unwrap().lock(),
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let nodes = a.contenders(&name).await.unwrap();
        if nodes.len() == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "nodes left behind by cancelled waiters: {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    g.release().await.unwrap();
    assert!(a.contenders(&name).await.unwrap().is_empty());
}

/// The server reaps the empty parent and a new one restarts sequence numbers at zero: the
/// fence (the node's czxid) still increases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_increasing_after_the_empty_parent_is_reaped() {
    let server = shared();
    let r = root();
    let b = backend(&format!("{}{r}", server.url())).await;
    let reg = registry(&b, RegistryOptions::default());
    let name = LockName::new("lock", "reaped").unwrap();
    let parent = b.lock_path(&name);
    let client = b.client().await.unwrap();
    let mut last = 0;
    for round in 0..2 {
        for _ in 0..3 {
            let g = reg.obtain("reaped").unwrap().lock().await.unwrap();
            let nodes = b.contenders(&name).await.unwrap();
            assert!(
                g.fence() > last,
                "round {round}: {} after {last}",
                g.fence()
            );
            last = g.fence();
            g.release().await.unwrap();
            if round == 1 {
                // A fresh parent counts from zero again (the test server reaps every 200 ms,
                // so the parent may even be new for each acquisition).
                assert!(nodes[0].ends_with("-lock-0000000000"), "{nodes:?}");
                break;
            }
        }
        // Wait until the container is gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.check_stat(&parent).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "{parent} not reaped");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
