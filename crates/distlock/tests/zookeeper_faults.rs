//! ZooKeeper backend faults on real servers: a server killed mid-hold, a session expired
//! underneath, a holder that stops, and a three-server ensemble losing a follower, then its
//! leader, or cutting a follower off. The invariant is always the same: never two holders at
//! once without the stale one learning it is lost, and fences always tell the stale one.
//!
//! Most tests start servers of their own; the rest share one per test process.

mod common {
    pub mod zookeeper;
}

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::zookeeper::*;
use distlock::backends::zookeeper::zookeeper_client;
use distlock::{Error, LockRegistry};
use distlock_testkit::proxy::FaultProxy;
use distlock_testkit::timing::{
    scheduling_slack, served_after_a_dead_waiter, told_by_the_lease_end,
};
use distlock_testkit::zookeeper::{ZooKeeperEnsemble, ZooKeeperServer, SYNC_LIMIT, TICK_TIME};
use tokio::time::{timeout, Instant};

/// Three ZooKeeper servers, the URL of a fresh root on them (sessions of 6 s, requests of
/// 1 s), and two registries on it with leases of 1.5 s.
async fn three_servers_and_two_registries(
) -> (ZooKeeperEnsemble, String, LockRegistry, LockRegistry) {
    let ensemble = ZooKeeperEnsemble::start(3).expect("three ZooKeeper servers");
    let url = format!(
        "{}{}?session_timeout=6s&request_timeout=1s",
        ensemble.url(),
        root()
    );
    let a = registry(&backend(&url).await, lease(1500));
    let b = registry(&backend(&url).await, lease(1500));
    (ensemble, url, a, b)
}

/// Named `zookeeper::…` so that `-E 'test(/zookeeper/)'` selects them.
mod zookeeper {
    use super::*;

    /// A distlock waiter that dies while another holds (here: its backend cut off behind a
    /// proxy that resets its connections and refuses new ones, so that its sessions end on the
    /// server as after SIGKILL) is taken out of the queue by the contender behind it once its
    /// waiter session ends: the next waiter gets the lock within the waiter ttl plus a tick and
    /// the machine's slack of the death, not after the dead waiter's lease (30 s).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_waiter_leaves_the_queue_within_the_waiter_ttl() {
        let server = shared();
        let r = root();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let holder = backend(&format!("{}{r}", server.url())).await;
        let doomed = backend(&format!("zk://{}{r}", proxy.addr())).await;
        let next = backend(&format!("{}{r}", server.url())).await;
        let waiter_ttl = doomed.options().waiter_ttl;
        let g = registry(&holder, lease(30_000))
            .obtain("dw")
            .unwrap()
            .lock()
            .await
            .unwrap();
        let dreg = registry(&doomed, lease(30_000));
        let doomed_task = tokio::spawn(async move { dreg.obtain("dw").unwrap().lock().await });
        let client = holder.client().await.unwrap();
        let path = format!("{r}/dw");
        let started = Instant::now();
        loop {
            // Queued and marked as a waiting distlock node.
            let children = client.list_children(&path).await.unwrap_or_default();
            let marked = futures_util::future::join_all(
                children
                    .iter()
                    .map(|c| client.get_data(&format!("{path}/{c}"))),
            )
            .await
            .into_iter()
            .any(|d| d.is_ok_and(|(data, _)| data.starts_with(b"distlock-waiting:")));
            if children.len() == 2 && marked {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{children:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let slack = scheduling_slack().await;
        proxy.cut();
        let died = Instant::now();
        g.release().await.unwrap();
        let limit = waiter_ttl + TICK_TIME + Duration::from_secs(10);
        let got = registry(&next, lease(30_000))
            .obtain("dw")
            .unwrap()
            .try_lock_for(limit)
            .await;
        served_after_a_dead_waiter(got, died, waiter_ttl + TICK_TIME, slack, "node").await;
        doomed_task.abort();
    }

    /// The server dies while a lock is held and comes back: the holder is told it lost the lock
    /// once its lease runs out unconfirmed, its node is deleted when the server is back, and the
    /// next holder gets a larger fence. Never two holders at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_killed_mid_hold_and_restarted() {
        let server = ZooKeeperServer::start().expect("ZooKeeper must be installed");
        let url = format!(
            "{}{}?session_timeout=4s&request_timeout=300ms",
            server.url(),
            root()
        );
        let a = backend(&url).await;
        let areg = registry(&a, lease(1200));
        let g = areg.obtain("job").unwrap().lock().await.unwrap();
        let old = g.fence();

        told_by_the_lease_end(
            &g,
            || server.kill(),
            Duration::from_secs(3),
            "holder not told it lost the lock while the server is down",
        )
        .await;
        assert!(!g.is_held());
        server.restart().expect("restart");

        let b = backend(&url).await;
        let breg = registry(&b, lease(1200));
        let next = timeout(Duration::from_secs(10), breg.obtain("job").unwrap().lock())
            .await
            .expect("lock free once the server is back")
            .unwrap();
        assert!(!g.is_held(), "two holders at once");
        assert!(next.fence() > old, "fence {} not above {old}", next.fence());
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        next.release().await.unwrap();

        // The old backend recovers (same session, resumed) and locks again.
        let g = timeout(Duration::from_secs(10), areg.obtain("job").unwrap().lock())
            .await
            .unwrap()
            .unwrap();
        g.release().await.unwrap();
    }

    /// Another client takes over the holder's session and closes it (as ZooKeeper's own tests and
    /// Curator's `KillSession` do, or an operator): the server deletes the holder's node with the
    /// session. The holder, cut off meanwhile, learns of the expiry when it reconnects and is told
    /// at its next renewal, well before its lease ends; the next holder's fence is larger (ZooKeeper
    /// cannot tell a cut-off client, so here the fence is what protects the data). The backend goes
    /// on with a new session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn session_expired_underneath() {
        let server = shared();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        // The session of the URL is the one of the lease, so `client()` is the holder's.
        let url = format!("zk://{}{}?session_timeout=3s", proxy.addr(), root());
        let a = backend(&url).await;
        let areg = registry(&a, lease(3000));
        let g = areg.obtain("job").unwrap().lock().await.unwrap();
        let old_session = a.client().await.unwrap().session_id();

        // Cut the holder off, take its session over from another connection, and close it.
        let info = a.client().await.unwrap().session().clone();
        proxy.cut();
        let thief = zookeeper_client::Client::connector()
            .with_session(info)
            .connect(&server.connect_string())
            .await
            .expect("take over the session");
        drop(thief);
        let b = backend(&format!("{}{}", server.url(), url_root(&url))).await;
        let next = timeout(
            Duration::from_secs(5),
            registry(&b, lease(3000)).obtain("job").unwrap().lock(),
        )
        .await
        .expect("the closed session's node is gone")
        .unwrap();
        assert!(next.fence() > g.fence());

        let lease_end = Instant::now() + g.remaining();
        proxy.restore();
        timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("holder not told that its session expired");
        // Told by the session's expiry when it reconnects, not by its lease running out.
        let told = Instant::now();
        assert!(
            told < lease_end,
            "told only by its lease ({:?} after the lease's end)",
            told - lease_end
        );
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        next.release().await.unwrap();

        let g = timeout(Duration::from_secs(5), areg.obtain("job").unwrap().lock())
            .await
            .expect("the backend recovers with a new session")
            .unwrap();
        assert_ne!(a.client().await.unwrap().session_id(), old_session);
        g.release().await.unwrap();
    }

    /// The root path of a `zk://…/root?…` URL.
    fn url_root(url: &str) -> &str {
        let rest = &url["zk://".len()..];
        let path = &rest[rest.find('/').unwrap()..];
        path.split('?').next().unwrap()
    }

    /// Three servers: with a follower down locks keep working; with the leader killed while a lock
    /// is held there are never two holders, a holder that cannot renew is told, and the lock
    /// works again once a new leader is elected.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ensemble_survives_losing_a_follower_and_then_its_leader() {
        let (ensemble, url, a, b) = three_servers_and_two_registries().await;

        // A follower down: acquisitions, renewals and hand-overs go on.
        // Asked with retries: one four-letter answer may be late on a loaded machine.
        let leader = ensemble.wait_serving(Duration::from_secs(20)).unwrap();
        let follower = (leader + 1) % 3;
        ensemble.kill(follower);
        let g = a.obtain("e").unwrap().lock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(2000)).await;
        assert!(g.is_held(), "lost with a follower down");
        assert!(matches!(
            b.obtain("e").unwrap().try_lock().await,
            Err(Error::NotAcquired { .. })
        ));
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.obtain("e").unwrap().lock().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let f1 = g.fence();
        g.release().await.unwrap();
        let g = Arc::new(
            timeout(Duration::from_secs(5), waiter)
                .await
                .unwrap()
                .unwrap()
                .unwrap(),
        );
        assert!(g.fence() > f1);
        ensemble.restart(follower).expect("follower back");

        // The leader killed while b holds the lock.
        let leader = ensemble.wait_serving(Duration::from_secs(20)).unwrap();
        let lost = g.lost();
        let watch_b = tokio::spawn(lost);
        let c = registry(&backend(&url).await, lease(1500));
        ensemble.kill(leader);
        let contender = tokio::spawn({
            let b_guard = Arc::downgrade(&g);
            async move {
                // Within a deadline, so that errors while there is no leader are retried.
                let mine = c
                    .obtain("e")
                    .unwrap()
                    .try_lock_for(Duration::from_secs(60))
                    .await
                    .unwrap();
                // b must know it lost the lock (or have released it) before anybody else has it.
                if let Some(g) = b_guard.upgrade() {
                    assert!(!g.is_held(), "two holders at once");
                }
                mine
            }
        });
        // Either b keeps its lock through the election (its session survives and renewals
        // succeed), or it is told it lost it: then c gets it. The election may take long on a
        // busy machine (one CI run saw more than 30 s): as long as c's own deadline.
        ensemble.wait_serving(Duration::from_secs(60)).unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        if g.is_held() {
            assert!(!contender.is_finished(), "two holders at once");
            watch_b.abort();
            let Ok(g) = Arc::try_unwrap(g) else {
                panic!("only guard")
            };
            g.release().await.unwrap();
        } else {
            timeout(Duration::from_secs(2), watch_b)
                .await
                .expect("lost signal")
                .unwrap();
        }
        let mine = timeout(Duration::from_secs(15), contender)
            .await
            .expect("the lock works again after the election")
            .unwrap();
        assert!(mine.fence() > f1);
        mine.release().await.unwrap();
        ensemble.restart(leader).expect("old leader back");
    }

    /// A holder that stops (here its network is cut: nothing it sends arrives, as when its
    /// process died) frees the lock after its lease plus one server tick (sessions end on a
    /// tick), not after a default session of 30 s: the session is sized to the lease.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_holder_frees_the_lock_after_its_lease() {
        let server = shared();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let r = root();
        let lease_of = Duration::from_secs(2);
        let a = backend(&format!("zk://{}{r}", proxy.addr())).await;
        let areg = registry(&a, lease(2000));
        let g = areg.obtain("job").unwrap().lock().await.unwrap();
        let b = backend(&format!("{}{r}", server.url())).await;
        let breg = registry(&b, lease(2000));
        let slack = scheduling_slack().await;

        proxy.pause();
        let stopped = Instant::now();
        let limit = lease_of + TICK_TIME + slack;
        let next = timeout(limit * 2, breg.obtain("job").unwrap().lock())
            .await
            .unwrap_or_else(|_| panic!("still held {:?} after the holder stopped", limit * 2))
            .unwrap();
        let freed = stopped.elapsed();
        assert!(
            freed <= limit,
            "freed {freed:?} after the holder stopped (lease {lease_of:?}, limit {limit:?})"
        );
        assert!(next.fence() > g.fence());
        assert!(!g.is_held(), "two holders at once");
        next.release().await.unwrap();
        drop(g);
        proxy.resume();
    }

    /// Three servers; the holder's only server is a follower that gets cut off from the other
    /// two. For up to syncLimit ticks it still answers reads from its own copy, while the
    /// leader lets the holder's session expire and another client takes the lock. Renewals go
    /// through the leader (`sync` first), so the holder's client-side lease ends before the
    /// other client gets the lock: never two holders at once without the stale one knowing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_behind_a_cut_off_follower_is_told_before_anyone_else_holds() {
        let ensemble = ZooKeeperEnsemble::start_partitionable(3)
            .await
            .expect("three ZooKeeper servers");
        let leader = ensemble.wait_serving(Duration::from_secs(20)).unwrap();
        let follower = (leader + 1) % 3;
        let other = (leader + 2) % 3;
        let r = root();
        let lease_of = Duration::from_millis(1500);
        let a = backend(&format!(
            "zk://{}{r}?session_timeout=1500ms&request_timeout=1s",
            ensemble.addr(follower)
        ))
        .await;
        let areg = registry(&a, lease(1500));
        let b = backend(&format!(
            "zk://{},{}{r}?request_timeout=1s",
            ensemble.addr(leader),
            ensemble.addr(other)
        ))
        .await;
        let breg = registry(&b, lease(1500));
        let g = Arc::new(areg.obtain("job").unwrap().lock().await.unwrap());

        // Cut between two renewals, so that the last one before the cut reached the leader.
        let before = g.remaining();
        let wait_renewal = Instant::now();
        while g.remaining() <= before && wait_renewal.elapsed() < lease_of {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(lease_of / 8).await;
        // The end of the holder's lease as its client sees it, followed until it is lost.
        let lease_end = Arc::new(Mutex::new(Instant::now() + g.remaining()));
        let follow = tokio::spawn({
            let g = g.clone();
            let lease_end = lease_end.clone();
            async move {
                while g.is_held() {
                    let end = Instant::now() + g.remaining();
                    {
                        let mut e = lease_end.lock().unwrap();
                        *e = (*e).max(end);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        });
        ensemble.isolate(follower);
        let cut = Instant::now();
        let stale_window = TICK_TIME * SYNC_LIMIT;
        let next = timeout(
            lease_of + stale_window + Duration::from_secs(10),
            breg.obtain("job").unwrap().lock(),
        )
        .await
        .expect("the lock is free once the leader ended the holder's session")
        .unwrap();
        let taken = Instant::now();
        // The follower keeps answering until the stale window is over; by then the holder
        // must long have known.
        tokio::time::sleep(
            (cut + stale_window + lease_of).saturating_duration_since(Instant::now()),
        )
        .await;
        assert!(!g.is_held());
        follow.await.unwrap();
        let lease_end = *lease_end.lock().unwrap();
        assert!(
            lease_end <= taken,
            "the holder's lease ran {:?} past the moment another client took the lock \
             ({:?} after the cut)",
            lease_end - taken,
            taken - cut
        );
        assert!(next.fence() > g.fence());
        next.release().await.unwrap();
        ensemble.heal();
    }

    /// A reader and a permit holder whose connection is killed (and stays refused) cannot
    /// renew: each is told it lost its hold by the end of its client-side lease, before the
    /// server ends its session, so a writer and another permit taker waiting on a healthy
    /// connection get in only after the losers were told, with larger fences.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cut_off_reader_and_permit_holder_are_told_before_others_get_in() {
        let server = shared();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let r = root();
        let a = backend(&format!("zk://{}{r}?request_timeout=500ms", proxy.addr())).await;
        let areg = registry(&a, lease(1500));
        let reader = Arc::new(areg.read_write("rw").unwrap().read().lock().await.unwrap());
        let permit = Arc::new(areg.semaphore("sem", 1).unwrap().lock().await.unwrap());
        let b = backend(&format!("{}{r}", server.url())).await;
        let breg = registry(&b, lease(1500));
        let writer = tokio::spawn({
            let (breg, old) = (breg.clone(), Arc::downgrade(&reader));
            async move {
                let g = breg.read_write("rw").unwrap().write().lock().await.unwrap();
                if let Some(old) = old.upgrade() {
                    assert!(
                        !old.is_held(),
                        "a writer beside a reader not told of its loss"
                    );
                }
                g
            }
        });
        let taker = tokio::spawn({
            let (breg, old) = (breg.clone(), Arc::downgrade(&permit));
            async move {
                let g = breg.semaphore("sem", 1).unwrap().lock().await.unwrap();
                if let Some(old) = old.upgrade() {
                    assert!(!old.is_held(), "two permits of one, the loser not told");
                }
                g
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!writer.is_finished() && !taker.is_finished());
        proxy.cut();
        let slack = scheduling_slack().await;
        let limit = Duration::from_millis(1500) * 2 + TICK_TIME + slack;
        for g in [&reader, &permit] {
            timeout(limit, g.lost())
                .await
                .unwrap_or_else(|_| panic!("{:?} not told of its loss", g.kind()));
        }
        let w = timeout(limit * 2, writer)
            .await
            .expect("the writer gets the key once the reader's session ended")
            .unwrap();
        let p = timeout(limit * 2, taker)
            .await
            .expect("the taker gets the permit once the holder's session ended")
            .unwrap();
        assert!(w.fence() > reader.fence() && p.fence() > permit.fence());
        proxy.restore();
        for g in [reader, permit] {
            let g = Arc::try_unwrap(g).expect("only guard");
            assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        }
        w.release().await.unwrap();
        p.release().await.unwrap();
    }

    /// Three servers, the leader killed while a reader and a permit holder hold: each either
    /// keeps its hold through the election or is told it lost it before a writer or another
    /// taker gets in; the kinds work again once a new leader serves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_holds_survive_a_leader_kill_or_are_told() {
        let (ensemble, _, a, c) = three_servers_and_two_registries().await;
        let leader = ensemble.wait_serving(Duration::from_secs(20)).unwrap();
        let reader = Arc::new(a.read_write("r").unwrap().read().lock().await.unwrap());
        let permit = Arc::new(a.semaphore("s", 1).unwrap().lock().await.unwrap());
        ensemble.kill(leader);
        let writer = tokio::spawn({
            let (c, old) = (c.clone(), Arc::downgrade(&reader));
            async move {
                let g = c
                    .read_write("r")
                    .unwrap()
                    .write()
                    .try_lock_for(Duration::from_secs(60))
                    .await
                    .unwrap();
                if let Some(old) = old.upgrade() {
                    assert!(!old.is_held(), "a writer beside a reader not told");
                }
                g
            }
        });
        let taker = tokio::spawn({
            let (c, old) = (c.clone(), Arc::downgrade(&permit));
            async move {
                let g = c
                    .semaphore("s", 1)
                    .unwrap()
                    .try_lock_for(Duration::from_secs(60))
                    .await
                    .unwrap();
                if let Some(old) = old.upgrade() {
                    assert!(!old.is_held(), "two permits of one, the loser not told");
                }
                g
            }
        });
        ensemble.wait_serving(Duration::from_secs(30)).unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        distlock_testkit::holds::handed_on_after_an_election(
            [(reader, writer), (permit, taker)],
            Duration::from_secs(15),
        )
        .await;
        ensemble.restart(leader).expect("old leader back");
    }
}
