//! etcd backend faults on real etcd servers: server killed mid-hold, lease revoked underneath,
//! a waiter's key lost while it waits, a dropped backend, and a three-node cluster losing a
//! follower and its leader; readers and permits under a revoked lease and a leader kill.

mod common {
    pub mod etcd;
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::etcd::*;
use distlock::backends::etcd::{EtcdBackend, EtcdOptions};
use distlock::{AcquireRequest, Attempt, Backend, Error, LockGuard};
use distlock::{LockName, LockRegistry, RegistryOptions, Token};
use distlock_testkit::etcd::{EtcdCluster, EtcdServer};
use distlock_testkit::proxy::FaultProxy;
use distlock_testkit::timing::{
    scheduling_slack, served_after_a_dead_waiter, told_by_the_lease_end,
};
use tokio::time::Instant;

/// Three etcd members, and two registries on them with 3 s leases under a fresh prefix.
async fn three_members_and_two_registries() -> (EtcdCluster, LockRegistry, LockRegistry) {
    let cluster = EtcdCluster::start(3).expect("etcd-server");
    let url = cluster.url();
    let p = prefix();
    let opts = RegistryOptions::default().with_lease(Duration::from_secs(3));
    let a = registry(&url, &p, opts.clone()).await;
    let b = registry(&url, &p, opts).await;
    (cluster, a, b)
}

/// A task that takes `lock`, retrying while the cluster elects a leader, and notes a
/// `violation` if it got it while `old` still believed it held.
fn take_through_the_election(
    lock: distlock::Lock,
    old: std::sync::Weak<LockGuard>,
    violation: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<LockGuard> {
    tokio::spawn(async move {
        loop {
            match lock.try_lock_for(Duration::from_secs(1)).await {
                Ok(g) => {
                    if old.upgrade().is_some_and(|o| o.is_held()) {
                        violation.store(true, Ordering::SeqCst);
                    }
                    return g;
                }
                Err(e) if e.is_retryable() => continue,
                Err(e) => panic!("{e}"),
            }
        }
    })
}

/// Named `etcd::…`, so that `-E 'test(/etcd/)'` selects them all.
mod etcd {
    use super::*;

    /// A waiter that dies while another holds (here: cut off behind a proxy that resets its
    /// connections and refuses new ones, so that nothing of it reaches the server again, as
    /// after SIGKILL) leaves the queue within the waiter ttl: after the holder's release the
    /// next waiter gets the lock within the waiter ttl plus etcd's lease expiry check (500 ms)
    /// and the machine's slack, not after the dead waiter's lease (30 s) or its session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_waiter_leaves_the_queue_within_the_waiter_ttl() {
        let (server, p) = shared_server();
        let dir = format!("{p}/dw/");
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let holder = registry(&server.url(), &p, RegistryOptions::default()).await;
        let doomed = registry(
            &format!("etcd://{}", proxy.addr()),
            &p,
            RegistryOptions::default(),
        )
        .await;
        let next = registry(&server.url(), &p, RegistryOptions::default()).await;
        let g = holder.obtain("dw").unwrap().lock().await.unwrap();
        let doomed_task = tokio::spawn(async move { doomed.obtain("dw").unwrap().lock().await });
        eventually("the doomed waiter queued", Duration::from_secs(10), || {
            server_keys(&server, &dir).len() == 2
        })
        .await;
        let slack = scheduling_slack().await;
        proxy.cut();
        let died = Instant::now();
        g.release().await.unwrap();
        let expiry = EtcdOptions::default().waiter_ttl + Duration::from_millis(500);
        let got = next
            .obtain("dw")
            .unwrap()
            .try_lock_for(expiry + Duration::from_secs(10))
            .await;
        served_after_a_dead_waiter(got, died, expiry, slack, "key").await;
        doomed_task.abort();
    }

    /// A holder whose session lease is revoked underneath learns it at its next renewal, and the
    /// next holder gets a larger fence.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lease_revoked_underneath_is_lost() {
        let (server, p) = shared_server();
        let short = RegistryOptions::default().with_lease(Duration::from_millis(900));
        let a = registry(&server.url(), &p, short).await;
        let b = registry(&server.url(), &p, RegistryOptions::default()).await;
        let g = a.obtain("rv").unwrap().lock().await.unwrap();
        let kv = server_keys(&server, &format!("{p}/rv/")).remove(0);
        let slack = scheduling_slack().await;
        server
            .etcdctl(&["lease", "revoke", &format!("{:x}", kv.lease)])
            .unwrap();
        let revoked = Instant::now();
        tokio::time::timeout(Duration::from_secs(2) + slack, g.lost())
            .await
            .expect("lost signal after the revocation");
        // At its next renewal: within a third of the lease, and never after the lease.
        assert!(
            revoked.elapsed() < Duration::from_millis(900) + slack,
            "told after {:?} (slack {slack:?})",
            revoked.elapsed()
        );
        assert!(matches!(g.ensure_held(), Err(Error::LockLost { .. })));
        let g2 = b
            .obtain("rv")
            .unwrap()
            .try_lock_for(Duration::from_secs(2))
            .await
            .unwrap();
        assert!(g2.fence() > g.fence());
        let f2 = g2.fence();
        g2.release().await.unwrap();
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        // The backend that lost its session takes a new one.
        let g3 = a
            .obtain("rv")
            .unwrap()
            .try_lock_for(Duration::from_secs(2))
            .await
            .unwrap();
        assert!(g3.fence() > f2);
        g3.release().await.unwrap();
    }

    /// The Jepsen case (etcd 3.4.3's lock): a waiter's key vanishes while it waits (its lease
    /// expired). When its predecessor goes, it must not report the lock acquired: it queues again,
    /// behind whoever came meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiter_whose_key_vanished_does_not_acquire() {
        let (server, p) = shared_server();
        let dir = format!("{p}/j/");
        // The waiter relies on its watch alone (no polling) to show that the re-check is what
        // catches the lost key.
        let no_poll = RegistryOptions::default().with_max_poll_interval(Duration::from_secs(30));
        let h = registry(&server.url(), &p, RegistryOptions::default()).await;
        let w = registry(&server.url(), &p, no_poll).await;
        let c = registry(&server.url(), &p, RegistryOptions::default()).await;
        let gh = h.obtain("j").unwrap().lock().await.unwrap();
        let w_task = tokio::spawn(async move {
            let g = w.obtain("j").unwrap().lock().await.unwrap();
            (g, Instant::now())
        });
        eventually("waiter queued", Duration::from_secs(5), || {
            server_keys(&server, &dir).len() == 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let w_key = server_keys(&server, &dir)[1].key.clone();
        server.etcdctl(&["del", &w_key]).unwrap();
        let c_task = tokio::spawn(async move {
            let g = c.obtain("j").unwrap().lock().await.unwrap();
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(300)).await;
            (g, at)
        });
        eventually("third contender queued", Duration::from_secs(5), || {
            server_keys(&server, &dir).len() == 2
        })
        .await;
        gh.release().await.unwrap();
        let (gc, c_at) = tokio::time::timeout(Duration::from_secs(5), c_task)
            .await
            .unwrap()
            .unwrap();
        assert!(
            !w_task.is_finished(),
            "the waiter whose key vanished reported the lock acquired"
        );
        let c_fence = gc.fence();
        gc.release().await.unwrap();
        let (gw, w_at) = tokio::time::timeout(Duration::from_secs(5), w_task)
            .await
            .unwrap()
            .unwrap();
        assert!(w_at > c_at);
        assert!(gw.fence() > c_fence);
        let kvs = server_keys(&server, &dir);
        assert_eq!(kvs.len(), 1, "the waiter holds with a key of its own");
        assert_eq!(gw.fence() >> 10, kvs[0].create_revision as u64);
        gw.release().await.unwrap();
    }

    /// The server dies while a lock is held: the holder cannot renew and is told it lost the lock
    /// when its lease ends; after the restart (etcd keeps its data and revision) the next holder
    /// gets a larger fence.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_killed_mid_hold_and_restarted() {
        let server = EtcdServer::start().expect("etcd-server");
        let p = prefix();
        let opts = RegistryOptions::default().with_lease(Duration::from_secs(1));
        let a = registry(&server.url(), &p, opts.clone()).await;
        let g = a.obtain("crash").unwrap().lock().await.unwrap();
        told_by_the_lease_end(
            &g,
            || server.kill(),
            Duration::from_secs(3),
            "the holder learns that it cannot keep the lock",
        )
        .await;
        server.restart().unwrap();
        let b = registry(&server.url(), &p, opts).await;
        let g2 = b
            .obtain("crash")
            .unwrap()
            .try_lock_for(Duration::from_secs(10))
            .await
            .expect("the lock is free again after the restart");
        assert!(g2.fence() > g.fence());
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        assert!(g2.is_held());
        g2.release().await.unwrap();
    }

    /// A backend that is dropped revokes its session: its keys go at once, not with the TTL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_backend_revokes_its_session() {
        let (server, p) = shared_server();
        let dir = format!("{p}/gone/");
        let name = LockName::new(p.as_str(), "gone").unwrap();
        let b = EtcdBackend::connect(&server.url()).await.unwrap();
        assert!(matches!(
            b.acquire(&AcquireRequest::new(
                name.clone(),
                Token::random(),
                Duration::from_secs(30)
            ))
            .await
            .unwrap(),
            Attempt::Acquired { .. }
        ));
        assert_eq!(server_keys(&server, &dir).len(), 1);
        drop(b);
        eventually(
            "key deleted by the revocation",
            Duration::from_secs(3),
            || server_keys(&server, &dir).is_empty(),
        )
        .await;
    }

    /// Three members on loopback: a follower stops (locks keep working), then the leader stops
    /// while a lock is held (never two holders at once; a holder that cannot renew is told).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_node_cluster_loses_a_follower_then_its_leader() {
        let (cluster, a, b) = three_members_and_two_registries().await;

        let leader = cluster.leader().unwrap();
        let follower = (leader + 1) % 3;
        cluster.kill(follower);
        let mut last = 0;
        for i in 0..6 {
            let reg = if i % 2 == 0 { &a } else { &b };
            let g = reg
                .obtain("c")
                .unwrap()
                .try_lock_for(Duration::from_secs(10))
                .await
                .expect("locks work without a follower");
            assert!(g.fence() > last);
            last = g.fence();
            g.release().await.unwrap();
        }
        cluster.restart(follower).unwrap();

        // Now the leader goes while `a` holds; `b` keeps trying.
        let ga = a.obtain("c").unwrap().lock().await.unwrap();
        let leader = cluster.leader().unwrap();
        let holder_a: Arc<Mutex<Option<LockGuard>>> = Arc::new(Mutex::new(Some(ga)));
        let violation = Arc::new(AtomicBool::new(false));
        let contender = {
            let (b, holder_a, violation) = (b.clone(), holder_a.clone(), violation.clone());
            tokio::spawn(async move {
                let lock = b.obtain("c").unwrap();
                loop {
                    match lock.try_lock_for(Duration::from_secs(1)).await {
                        Ok(g) => {
                            let a_held = holder_a
                                .lock()
                                .unwrap()
                                .as_ref()
                                .is_some_and(|g| g.is_held());
                            if a_held {
                                violation.store(true, Ordering::SeqCst);
                            }
                            return g;
                        }
                        Err(e) if e.is_retryable() => continue,
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        };
        cluster.kill(leader);
        let killed = Instant::now();
        // Watch a's guard for a while after the leader's death: it either keeps the lock (renewal
        // goes through the new leader) or is told it lost it before anybody else gets it.
        while killed.elapsed() < Duration::from_secs(5) && !contender.is_finished() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ga = holder_a.lock().unwrap().take().unwrap();
        println!(
            "after the leader's death: holder kept the lock: {}, contender done: {}",
            ga.is_held(),
            contender.is_finished()
        );
        if ga.is_held() {
            ga.release()
                .await
                .expect("the holder kept the lock through the election");
        } else {
            tokio::time::timeout(Duration::from_millis(100), ga.lost())
                .await
                .expect("a holder that cannot renew is told");
            drop(ga);
        }
        let gb = tokio::time::timeout(Duration::from_secs(20), contender)
            .await
            .expect("the lock is available again after the election")
            .unwrap();
        assert!(!violation.load(Ordering::SeqCst), "two holders at once");
        assert!(gb.fence() > last);
        last = gb.fence();
        gb.release().await.unwrap();
        cluster.restart(leader).unwrap();

        // Without a quorum nobody can renew: the holder is told when its lease ends, and once a
        // quorum is back the next holder gets a larger fence.
        let ga = a.obtain("c").unwrap().lock().await.unwrap();
        let (x, y) = (
            cluster.leader().unwrap(),
            (cluster.leader().unwrap() + 1) % 3,
        );
        told_by_the_lease_end(
            &ga,
            || {
                cluster.kill(x);
                cluster.kill(y);
            },
            Duration::from_secs(6),
            "a holder that cannot renew is told",
        )
        .await;
        drop(ga);
        cluster.restart(x).unwrap();
        let gb = b
            .obtain("c")
            .unwrap()
            .try_lock_for(Duration::from_secs(20))
            .await
            .expect("the lock is free once a quorum is back");
        assert!(gb.fence() > last);
        gb.release().await.unwrap();
    }

    /// A reader and a permit holder whose session lease is revoked underneath (their keys go
    /// with it) learn it at their next renewal; a writer and another taker that waited get in,
    /// with larger fences, and never while a loser still believes it holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_holds_whose_lease_is_revoked_are_lost() {
        let (server, p) = shared_server();
        let short = RegistryOptions::default().with_lease(Duration::from_millis(900));
        let a = registry(&server.url(), &p, short).await;
        let b = registry(&server.url(), &p, RegistryOptions::default()).await;
        let reader = Arc::new(a.read_write("r").unwrap().read().lock().await.unwrap());
        let permit = Arc::new(a.semaphore("s", 1).unwrap().lock().await.unwrap());
        let writer = tokio::spawn({
            let (b, old) = (b.clone(), Arc::downgrade(&reader));
            async move {
                let g = b.read_write("r").unwrap().write().lock().await.unwrap();
                let stale = old.upgrade().is_some_and(|o| o.is_held());
                (g, stale)
            }
        });
        let taker = tokio::spawn({
            let (b, old) = (b.clone(), Arc::downgrade(&permit));
            async move {
                let g = b.semaphore("s", 1).unwrap().lock().await.unwrap();
                let stale = old.upgrade().is_some_and(|o| o.is_held());
                (g, stale)
            }
        });
        let lease = server_keys(&server, &format!("{p}/r/"))[0].lease;
        assert_eq!(
            server_keys(&server, &format!("{p}/s/"))[0].lease,
            lease,
            "shared holds of one lease length share a session"
        );
        let slack = scheduling_slack().await;
        server
            .etcdctl(&["lease", "revoke", &format!("{lease:x}")])
            .unwrap();
        for g in [&reader, &permit] {
            tokio::time::timeout(Duration::from_secs(2) + slack, g.lost())
                .await
                .unwrap_or_else(|_| panic!("{:?} not told that its lease went", g.kind()));
        }
        for (task, old) in [(writer, &reader), (taker, &permit)] {
            let (g, stale) = tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("the waiter gets in once the revoked keys are gone")
                .unwrap();
            // The keys went with the lease at once, so the waiter may get in before the loser's
            // next renewal: the fence tells the stale holder.
            if stale {
                println!("{:?}: waiter in before the loser's renewal", old.kind());
            }
            assert!(g.fence() > old.fence());
            g.release().await.unwrap();
        }
        for g in [reader, permit] {
            let g = Arc::try_unwrap(g).expect("only guard");
            assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        }
    }

    /// Three members, the leader killed while a reader and a permit holder hold: each either
    /// keeps its hold through the election or is told it lost it before a writer or another
    /// taker gets in; the kinds work again afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_holds_through_a_leader_kill_are_kept_or_told() {
        let (cluster, a, c) = three_members_and_two_registries().await;
        let reader = Arc::new(a.read_write("r").unwrap().read().lock().await.unwrap());
        let permit = Arc::new(a.semaphore("s", 1).unwrap().lock().await.unwrap());
        let leader = cluster.leader().unwrap();
        cluster.kill(leader);
        let violation = Arc::new(AtomicBool::new(false));
        let writer = take_through_the_election(
            c.read_write("r").unwrap().write().clone(),
            Arc::downgrade(&reader),
            violation.clone(),
        );
        let taker = take_through_the_election(
            c.semaphore("s", 1).unwrap(),
            Arc::downgrade(&permit),
            violation.clone(),
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        distlock_testkit::holds::handed_on_after_an_election(
            [(reader, writer), (permit, taker)],
            Duration::from_secs(20),
        )
        .await;
        assert!(!violation.load(Ordering::SeqCst), "two holders at once");
        cluster.restart(leader).unwrap();
    }
}
