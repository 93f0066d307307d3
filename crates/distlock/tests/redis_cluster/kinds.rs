//! Read-write locks and semaphores on a cluster: every key in the lock key's slot, `list` over
//! every shard, mixed renewals across slots, releases heard on any node, and read holds and
//! permits through a master killed or a failover that lost them.

use super::redis_common::take_and_release;
use super::*;

/// Read holds, permits and writes on keys of every shard, and on keys whose braces make no
/// hash tag (Redisson's timeout-key names would be in another slot, and Cluster refuses a
/// script that touches two slots): all taken, listed from every shard, renewed together past
/// several leases, inspected and force-released through the slot map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_works_on_every_shard_and_is_listed_and_renewed() {
    let mut set = cluster();
    let url = set.url();
    let lease = Duration::from_millis(1500);
    let reg = registry(&url, lease).await;
    let other = registry(&url, lease).await;
    let backend = RedisBackend::connect(&url).await.unwrap();
    let shards = key_per_master(&mut set, "k");
    let mut held: Vec<(String, LockGuard)> = Vec::new();
    for (key, _) in &shards {
        let read = reg.read_write(&format!("{key}-r")).unwrap();
        held.push((format!("{key}-r"), read.read().lock().await.unwrap()));
        let pool = reg.semaphore(&format!("{key}-s"), 2).unwrap();
        held.push((format!("{key}-s"), pool.lock().await.unwrap()));
        let rw = reg.read_write(&format!("{key}-w")).unwrap();
        held.push((format!("{key}-w"), rw.write().lock().await.unwrap()));
        held.push((key.clone(), reg.obtain(key).unwrap().lock().await.unwrap()));
    }
    for odd in ["odd}key", "x{y", "{}z"] {
        let rw = reg.read_write(odd).unwrap();
        held.push((odd.to_owned(), rw.read().lock().await.unwrap()));
        let pool = reg.semaphore(&format!("{odd}-s"), 3).unwrap();
        held.push((format!("{odd}-s"), pool.lock().await.unwrap()));
    }
    // Where Redisson's names are in the slot, the layout is Redisson's.
    let lock_key = format!("lock:{}-r", shards[0].0);
    let slot = set.slot_of(&lock_key).unwrap();
    let master = &set.master_of(slot).unwrap();
    assert_eq!(
        set.nodes[*master]
            .cli(&["HGET", &lock_key, "mode"])
            .unwrap(),
        "read"
    );
    let token = held[0].1.token().to_string();
    let timeout_key = format!("{{{lock_key}}}:{token}:rwlock_timeout:1");
    assert_eq!(
        set.nodes[*master].cli(&["EXISTS", &timeout_key]).unwrap(),
        "1",
        "{timeout_key} on the slot's master"
    );
    let mut expected: Vec<String> = held.iter().map(|(k, _)| k.clone()).collect();
    expected.sort();
    let l = listed(&backend).await;
    assert_eq!(
        l.iter().map(|l| l.key.clone()).collect::<Vec<_>>(),
        expected,
        "every shard's keys, no bookkeeping"
    );
    for entry in &l {
        let (_, g) = held.iter().find(|(k, _)| *k == entry.key).unwrap();
        let want = match g.kind() {
            LockKind::Semaphore { permits } => LockKind::Semaphore { permits },
            k => k,
        };
        assert_eq!(entry.info.kind, Some(want), "{}", entry.key);
        assert_eq!(entry.info.holders, Some(1), "{}", entry.key);
    }
    // Others are kept out, whatever the kind.
    for (key, g) in &held {
        let refused = match g.kind() {
            LockKind::Read => other.read_write(key).unwrap().write().try_lock().await,
            LockKind::Semaphore { .. } => other.obtain(key).unwrap().try_lock().await,
            _ => other.read_write(key).unwrap().read().try_lock().await,
        };
        assert!(
            matches!(refused, Err(Error::NotAcquired { .. })),
            "{key}: {refused:?}"
        );
    }
    // Renewed together (mixed kinds, many slots) past several leases.
    tokio::time::sleep(lease * 3).await;
    for (key, g) in &held {
        assert!(g.is_held(), "{key} was not renewed");
    }
    // Inspected and forced through the slot map.
    let odd = distlock::LockName::new("lock", "odd}key").unwrap();
    let info = backend.inspect(&odd).await.unwrap().expect("held");
    assert_eq!((info.kind, info.holders), (Some(LockKind::Read), Some(1)));
    assert!(backend.force_release(&odd).await.unwrap());
    let (_, forced) = held.iter().find(|(k, _)| k == "odd}key").unwrap();
    tokio::time::timeout(lease * 2, forced.lost())
        .await
        .expect("the forced reader learns it lost");
    let w = other
        .read_write("odd}key")
        .unwrap()
        .write()
        .try_lock()
        .await;
    let w = w.expect("a writer once the reader was forced out");
    assert!(w.fence() > forced.fence());
    w.release().await.unwrap();
    for (key, g) in held {
        if key != "odd}key" {
            g.release().await.unwrap();
        }
    }
    assert!(listed(&backend).await.is_empty(), "nothing left held");
}

/// `list("lock")`, sorted by key.
async fn listed(backend: &RedisBackend) -> Vec<distlock::ListedLock> {
    let mut l = backend.list("lock").await.unwrap();
    l.sort_by(|a, b| a.key.cmp(&b.key));
    l
}

/// The next message on `messages`: its channel and payload.
async fn next_message(
    messages: &mut (impl futures_util::Stream<Item = redis::Msg> + Unpin),
) -> (String, String) {
    let msg = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .expect("a message")
        .unwrap();
    (
        msg.get_channel_name().to_owned(),
        msg.get_payload::<String>().unwrap(),
    )
}

/// Releases of readers, writers and permits are published on the lock's channel and (readers,
/// writers) on Redisson's `redisson_rwlock:{<lock key>}`; the cluster forwards both to every
/// node, so a listener on a node that does not serve the slot hears them, and a waiter of
/// each kind is woken at once on every shard, long before its first poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_of_every_kind_are_heard_on_any_node() {
    let mut set = cluster();
    let url = set.url();
    let slot = set.slot_of("lock:doc").unwrap();
    let master = set.master_of(slot).unwrap();
    let elsewhere = (0..3).find(|m| *m != master).unwrap();
    let client = redis::Client::open(set.nodes[elsewhere].url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .subscribe("redisson_rwlock:{lock:doc}")
        .await
        .unwrap();
    pubsub.subscribe("lock-channel:lock:doc").await.unwrap();
    let mut messages = pubsub.on_message();
    let reg = registry(&url, Duration::from_secs(30)).await;
    let rw = reg.read_write("doc").unwrap();
    rw.read().lock().await.unwrap().release().await.unwrap();
    assert_eq!(
        next_message(&mut messages).await,
        ("redisson_rwlock:{lock:doc}".into(), "0".into())
    );
    assert_eq!(
        next_message(&mut messages).await,
        ("lock-channel:lock:doc".into(), "lock:doc".into())
    );
    rw.write().lock().await.unwrap().release().await.unwrap();
    assert_eq!(
        next_message(&mut messages).await,
        ("redisson_rwlock:{lock:doc}".into(), "1".into())
    );
    assert_eq!(
        next_message(&mut messages).await,
        ("lock-channel:lock:doc".into(), "lock:doc".into())
    );
    take_and_release(reg.semaphore("doc", 2)).await;
    assert_eq!(
        next_message(&mut messages).await,
        ("lock-channel:lock:doc".into(), "lock:doc".into())
    );

    let poll = Duration::from_secs(120);
    let (holder, waiter) = holder_and_slow_waiter(&url, poll).await;
    let bound = (poll / 8).min(Duration::from_secs(5) + scheduling_slack().await);
    for (key, _) in key_per_master(&mut set, "wake") {
        // A reader's release wakes a writer; a permit's release wakes a permit taker.
        let r = distlock_testkit::holds::read(&holder, &key).await;
        let (w, k) = (waiter.clone(), key.clone());
        let writer = tokio::spawn(async move { w.read_write(&k).unwrap().write().lock().await });
        let p = holder
            .semaphore(&format!("{key}-s"), 1)
            .unwrap()
            .lock()
            .await
            .unwrap();
        let (w, k) = (waiter.clone(), format!("{key}-s"));
        let taker = tokio::spawn(async move { w.semaphore(&k, 1).unwrap().lock().await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        r.release().await.unwrap();
        p.release().await.unwrap();
        for (what, waiting) in [("writer", writer), ("permit taker", taker)] {
            woken_within(waiting, released, bound, &format!("{key}: the {what}")).await;
        }
    }
}

/// A read hold and a permit acknowledged by a replica (`min_replicas` 1) survive the slot's
/// master killed: nobody else gets a conflicting hold while the holder still holds, the holder
/// keeps renewing on the promoted replica, and the next fences are higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_hold_and_a_permit_survive_the_master_killed() {
    let mut set = cluster();
    let lease = Duration::from_secs(30);
    // Said, not left to the default, which follows the slot map read at connect (a replica
    // briefly missing from it on a loaded machine makes it 0: nothing waits for the holds to
    // reach the replica, and the failover may lose them). A short `WAIT`: until the killed
    // node rejoins, the promoted master has no replica and every attempt of the kinds waits
    // for none.
    let url = format!("{}?min_replicas=1&replica_timeout=200ms", set.url());
    let holder = registry(&url, lease).await;
    let other = registry(&url, lease).await;
    // One hash tag: both keys on the master that is killed.
    let (doc, pool) = ("{s}doc", "{s}pool");
    let r = holder.read_write(doc).unwrap().read().lock().await.unwrap();
    let p = holder.semaphore(pool, 1).unwrap().lock().await.unwrap();
    let fences = (r.fence(), p.fence());
    let slot = set.slot_of("lock:{s}doc").unwrap();
    let master = set.master_of(slot).unwrap();
    let promoted = blocking(|| set.kill_master(master)).expect("failover after kill -9");
    assert_ne!(promoted, master);
    // Back empty, the killed node follows the promoted replica, which has a replica again.
    blocking(|| set.rejoin(master, promoted)).expect("the killed master rejoins");
    // Kept, or told lost before anyone else holds: never both unannounced.
    for _ in 0..100 {
        let w = other.read_write(doc).unwrap().write().try_lock().await;
        let q = other.semaphore(pool, 1).unwrap().try_lock().await;
        if matches!(w, Err(Error::Unavailable { .. }))
            || matches!(q, Err(Error::Unavailable { .. }))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        if let Ok(w) = &w {
            assert!(
                !r.is_held(),
                "a writer beside a reader that does not know it lost"
            );
            assert!(w.fence() > fences.0);
        }
        if let Ok(q) = &q {
            assert!(!p.is_held(), "two holders of one permit, unannounced");
            assert!(q.fence() > fences.1);
        }
        assert!(
            matches!(w, Err(Error::NotAcquired { .. }))
                && matches!(q, Err(Error::NotAcquired { .. })),
            "acknowledged holds must survive the failover: {w:?} {q:?}"
        );
        break;
    }
    assert!(r.is_held() && p.is_held(), "the acknowledged holds survive");
    assert_eq!(
        set.nodes[promoted]
            .cli(&["HGET", "lock:{s}doc", "mode"])
            .unwrap(),
        "read"
    );
    assert_eq!(
        set.nodes[promoted]
            .cli(&[
                "EXISTS",
                &format!("lock:{{s}}doc:{}:rwlock_timeout:1", r.token())
            ])
            .unwrap(),
        "1",
        "the reader's timeout key was replicated"
    );
    assert_ne!(
        set.nodes[promoted]
            .cli(&["SET", "lock:{s}doc", "foreign", "NX", "PX", "60000"])
            .unwrap(),
        "OK"
    );
    extend_after_failover(&r, lease, 101).await;
    extend_after_failover(&p, lease, 101).await;
    r.release().await.unwrap();
    p.release().await.unwrap();
    let w = loop {
        match other.read_write(doc).unwrap().write().lock().await {
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            w => break w.expect("a writer after the reader left"),
        }
    };
    let q = loop {
        match other.semaphore(pool, 1).unwrap().lock().await {
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            q => break q.expect("the permit after its holder left"),
        }
    };
    assert!(w.fence() > fences.0 && q.fence() > fences.1);
    w.release().await.unwrap();
    q.release().await.unwrap();
}

/// Without `WAIT` (`min_replicas=0`), a permit taken while the replica was cut off is lost
/// when the master dies: its holder is told by its next renewal, well before its lease ends,
/// and the next taker's fence is higher than the lost one although the promoted replica's
/// counter never saw it (the kinds' fences are floored at the server clock too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_the_failover_lost_is_reported_lost() {
    let mut set = cluster();
    let lease = Duration::from_secs(20);
    let url = format!("{}?min_replicas=0", set.url());
    let holder = registry(&url, lease).await;
    let other = registry(&url, lease).await;
    let slot = set.slot_of("lock:pool").unwrap();
    let master = set.master_of(slot).unwrap();
    let replica = set.replicas_of(master)[0];
    // An earlier permit, replicated, so that the replica knows the fence counter.
    let p = holder.semaphore("pool", 1).unwrap().lock().await.unwrap();
    let earlier = p.fence();
    p.release().await.unwrap();
    blocking(|| caught_up(&set, master, replica));
    set.nodes[replica].pause().unwrap();
    set.nodes[master]
        .cli(&["CLIENT", "KILL", "TYPE", "replica"])
        .unwrap();
    let started = Instant::now();
    let p = holder.semaphore("pool", 1).unwrap().lock().await.unwrap();
    assert!(p.fence() > earlier);
    set.nodes[master].kill();
    set.nodes[replica].resume().unwrap();
    blocking(|| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while set.master_of(slot) != Some(replica) {
            assert!(Instant::now() < deadline, "the replica is not promoted");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert_eq!(
        set.nodes[replica].cli(&["EXISTS", "lock:pool"]).unwrap(),
        "0",
        "the promoted replica never had the permit"
    );
    tokio::time::timeout(lease, p.lost())
        .await
        .expect("the holder is told it lost its permit");
    assert!(
        started.elapsed() < lease,
        "told by a renewal, not only when the lease ran out ({:?})",
        started.elapsed()
    );
    let q = loop {
        match other.semaphore("pool", 1).unwrap().lock().await {
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            q => break q.expect("the permit"),
        }
    };
    assert!(
        q.fence() > p.fence(),
        "fence {} after {}",
        q.fence(),
        p.fence()
    );
    q.release().await.unwrap();
}
