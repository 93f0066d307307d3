//! ZooKeeper backend on real servers: Curator's layout, key mapping, FIFO and predecessor-only
//! watches, faults (server killed mid-hold, session expired underneath, the empty parent
//! reaped), digest authentication, and a three-server ensemble losing a follower and then its
//! leader. The invariant is always the same: never two holders at once without the stale one
//! learning it is lost, and fences always tell the stale one.
//!
//! Most tests share one throwaway server per test process, each under its own root; the fault
//! tests start their own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::backends::zookeeper::{zookeeper_client, ZooKeeperBackend};
use distlock::testkit::proxy::FaultProxy;
use distlock::testkit::timing::scheduling_slack;
use distlock::testkit::zookeeper::{ZooKeeperEnsemble, ZooKeeperServer, SYNC_LIMIT, TICK_TIME};
use distlock::{
    AcquireMode, Attempt, Backend, Error, LockName, LockRegistry, RegistryOptions, Token,
};
use tokio::time::{timeout, Instant};

fn shared() -> Arc<ZooKeeperServer> {
    ZooKeeperServer::shared().expect("ZooKeeper must be installed (apt-get install zookeeper)")
}

/// A root of this test's own.
fn root() -> String {
    format!("/t{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    Token::random().as_u128() as u64
}

async fn backend(url: &str) -> Arc<ZooKeeperBackend> {
    Arc::new(ZooKeeperBackend::connect(url).await.expect("connect"))
}

fn registry(b: &Arc<ZooKeeperBackend>, opts: RegistryOptions) -> LockRegistry {
    LockRegistry::from_backend(b.clone() as Arc<dyn Backend>, opts).unwrap()
}

fn lease(ms: u64) -> RegistryOptions {
    RegistryOptions::default().with_lease(Duration::from_millis(ms))
}

/// `_c_<8-4-4-4-12 hex>-lock-<10 digits>`.
fn is_curator_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("_c_") else {
        return false;
    };
    let (uuid, tail) = rest.split_at(36.min(rest.len()));
    let groups: Vec<&str> = uuid.split('-').collect();
    let uuid_ok = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| {
            g.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        });
    let seq_ok = tail
        .strip_prefix("-lock-")
        .is_some_and(|s| s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit()));
    uuid_ok && seq_ok
}

/// Named `zookeeper::…` so that `-E 'test(/zookeeper/)'` selects them.
mod zookeeper {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nodes_follow_curators_interprocess_mutex_layout() {
        let server = shared();
        // Default root: /<prefix>, so /lock with the default prefix.
        let b = backend(&server.url()).await;
        let key = format!("voucher:{}", rand_u64());
        let name = LockName::new("lock", &key).unwrap();
        assert_eq!(b.lock_path(&name), format!("/lock/{key}"));
        let reg = registry(&b, RegistryOptions::default());
        let g = reg.obtain(&key).unwrap().lock().await.unwrap();

        // A waiter from another session queues behind the holder.
        let w = backend(&server.url()).await;
        let wreg = registry(&w, RegistryOptions::default());
        let waiter = tokio::spawn({
            let key = key.clone();
            async move {
                let g = wreg.obtain(&key).unwrap().lock().await.unwrap();
                let f = g.fence();
                g.release().await.unwrap();
                f
            }
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let nodes = loop {
            let n = b.contenders(&name).await.unwrap();
            if n.len() == 2 || Instant::now() > deadline {
                break n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(nodes.len(), 2, "{nodes:?}");
        for n in &nodes {
            assert!(is_curator_name(n), "{n:?} is not _c_<uuid>-lock-<seq>");
        }
        // Ephemeral nodes of two different sessions; the holder's czxid is the fence.
        let client = b.client().await.unwrap();
        let (_, holder) = client
            .get_data(&format!("/lock/{key}/{}", nodes[0]))
            .await
            .unwrap();
        let (_, queued) = client
            .get_data(&format!("/lock/{key}/{}", nodes[1]))
            .await
            .unwrap();
        assert_ne!(holder.ephemeral_owner, 0);
        assert_ne!(queued.ephemeral_owner, 0);
        assert_ne!(holder.ephemeral_owner, queued.ephemeral_owner);
        let info = reg.obtain(&key).unwrap().inspect().await.unwrap().unwrap();
        assert_eq!(info.fence, Some(holder.czxid as u64));
        assert_eq!(g.fence(), (holder.czxid as u64) << 10);

        g.release().await.unwrap();
        let next = timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next, (queued.czxid as u64) << 10);

        // The URL's path replaces the default root (Spring uses /SpringIntegration-LockRegistry).
        let spring_root = format!("{}/SpringIntegration-LockRegistry", root());
        let s = backend(&format!("{}{spring_root}", server.url())).await;
        assert_eq!(s.lock_path(&name), format!("{spring_root}/{key}"));
        let g = registry(&s, RegistryOptions::default())
            .obtain(&key)
            .unwrap()
            .try_lock()
            .await
            .unwrap();
        let children = client
            .list_children(&format!("{spring_root}/{key}"))
            .await
            .unwrap();
        assert_eq!(children.len(), 1);
        assert!(is_curator_name(&children[0]));
        g.release().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_with_slashes_is_one_path_component() {
        let server = shared();
        let r = root();
        let b = backend(&format!("{}{r}", server.url())).await;
        let reg = registry(&b, RegistryOptions::default());
        let g1 = reg.obtain("a/b/c").unwrap().try_lock().await.unwrap();
        let g2 = reg.obtain("a").unwrap().try_lock().await.unwrap();
        let g3 = reg.obtain("..").unwrap().try_lock().await.unwrap();
        let g4 = reg.obtain("100% 🦀").unwrap().try_lock().await.unwrap();
        let client = b.client().await.unwrap();
        let mut children = client.list_children(&r).await.unwrap();
        children.sort();
        assert_eq!(
            children,
            ["%2E%2E", "100%25 %F0%9F%A6%80", "a", "a%2Fb%2Fc"]
        );
        for g in [g1, g2, g3, g4] {
            g.release().await.unwrap();
        }
    }

    /// A foreign contender (a Curator or Spring client) in the same layout excludes distlock and
    /// is excluded by it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_curator_client_on_the_same_path_excludes_us() {
        let server = shared();
        let r = root();
        let b = backend(&format!("{}{r}", server.url())).await;
        let reg = registry(&b, RegistryOptions::default());
        // Curator: creatingParentContainersIfNeeded().withProtection().withMode(EPHEMERAL_SEQUENTIAL)
        let curator = zookeeper_client::Client::connect(&server.connect_string())
            .await
            .unwrap();
        let acls = zookeeper_client::Acls::anyone_all();
        curator
            .mkdir(
                &format!("{r}/job"),
                &zookeeper_client::CreateMode::Container.with_acls(acls),
            )
            .await
            .unwrap();
        let (stat, seq) = curator
            .create(
                &format!("{r}/job/_c_9f2a61c0-7a43-4d2e-b3d1-5c8e0f4a2b17-lock-"),
                b"10.0.0.7",
                &zookeeper_client::CreateMode::EphemeralSequential.with_acls(acls),
            )
            .await
            .unwrap();
        let lock = reg.obtain("job").unwrap();
        assert!(matches!(
            lock.try_lock().await,
            Err(Error::NotAcquired { .. })
        ));
        assert_eq!(
            lock.inspect().await.unwrap().unwrap().fence,
            Some(stat.czxid as u64)
        );
        // Queued behind it; it lets go; we get it.
        let waiter = tokio::spawn(async move { lock.lock().await.map(|g| g.fence()) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished());
        curator
            .delete(
                &format!("{r}/job/_c_9f2a61c0-7a43-4d2e-b3d1-5c8e0f4a2b17-lock-{seq}"),
                None,
            )
            .await
            .unwrap();
        let fence = timeout(Duration::from_secs(2), waiter)
            .await
            .expect("woken by the foreign release")
            .unwrap()
            .unwrap();
        assert!(fence > (stat.czxid as u64) << 10);
    }

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
            holder
                .acquire(&name, first, lease, AcquireMode::Queue)
                .await
                .unwrap(),
            Attempt::Acquired { .. }
        ));
        let mut waiters = Vec::new();
        for _ in 0..5 {
            let b = backend(&url).await;
            let t = Token::random();
            let sub = b.subscribe(&name, t).await.unwrap();
            assert!(matches!(
                b.acquire(&name, t, lease, AcquireMode::Queue)
                    .await
                    .unwrap(),
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
            match b
                .acquire(&name, t, lease, AcquireMode::Queue)
                .await
                .unwrap()
            {
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
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let g = reg.obtain("fifo").unwrap().lock().await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
                g.release().await.unwrap();
            }));
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

        let slack = scheduling_slack().await;
        let lease_left = g.remaining();
        server.kill();
        let killed = Instant::now();
        timeout(Duration::from_secs(3) + slack, g.lost())
            .await
            .expect("holder not told it lost the lock while the server is down");
        assert!(!g.is_held());
        // Told by the end of its client-side lease at the latest.
        assert!(
            killed.elapsed() <= lease_left + slack,
            "told after {:?} (lease left {lease_left:?}, slack {slack:?})",
            killed.elapsed()
        );
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

    /// Digest credentials: nodes get the CREATOR_ALL ACL, so a client without them can neither
    /// take nor queue for the lock; the password never shows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn digest_authentication_protects_the_nodes() {
        let server = shared();
        let r = root();
        let with = |cred: &str| {
            format!(
                "zk://{cred}127.0.0.1:{}{r}?allow_insecure_auth=true",
                server.port()
            )
        };
        let alice = backend(&with("alice:s3cr%40t@")).await;
        assert!(!format!("{alice:?}").contains("s3cr"), "{alice:?}");
        let g = registry(&alice, RegistryOptions::default())
            .obtain("k")
            .unwrap()
            .lock()
            .await
            .unwrap();
        let acl = alice
            .client()
            .await
            .unwrap()
            .get_acl(&format!("{r}/k"))
            .await
            .unwrap()
            .0;
        assert_eq!(acl.len(), 1);
        assert_eq!(acl[0].scheme(), "digest");
        assert!(acl[0].id().starts_with("alice:"), "{:?}", acl[0]);

        let anonymous = registry(&backend(&with("")).await, RegistryOptions::default());
        let err = anonymous.obtain("k").unwrap().try_lock().await.unwrap_err();
        assert!(
            matches!(&err, Error::Backend { message, .. } if message.contains("permission")),
            "{err:?}"
        );
        let mallory = registry(
            &backend(&with("alice:wrong@")).await,
            RegistryOptions::default(),
        );
        assert!(matches!(
            mallory.obtain("k").unwrap().try_lock().await,
            Err(Error::Backend { .. })
        ));
        let alice2 = registry(
            &backend(&with("alice:s3cr%40t@")).await,
            RegistryOptions::default(),
        );
        assert!(matches!(
            alice2.obtain("k").unwrap().try_lock().await,
            Err(Error::NotAcquired { .. })
        ));
        g.release().await.unwrap();
        alice2
            .obtain("k")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_urls_and_unreachable_servers_are_typed_errors() {
        for url in ["zk://", "zk://127.0.0.1:x", "zk://127.0.0.1:1/a//b"] {
            assert!(
                matches!(
                    ZooKeeperBackend::connect(url).await,
                    Err(Error::InvalidConfig(_))
                ),
                "{url}"
            );
        }
        let started = Instant::now();
        let err = distlock::connect("zk://127.0.0.1:1?connect_timeout=1s")
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    /// Three servers: with a follower down locks keep working; with the leader killed while a lock
    /// is held there are never two holders, a holder that cannot renew is told, and the lock
    /// works again once a new leader is elected.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ensemble_survives_losing_a_follower_and_then_its_leader() {
        let ensemble = ZooKeeperEnsemble::start(3).expect("three ZooKeeper servers");
        let url = format!(
            "{}{}?session_timeout=6s&request_timeout=1s",
            ensemble.url(),
            root()
        );
        let a = registry(&backend(&url).await, lease(1500));
        let b = registry(&backend(&url).await, lease(1500));

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
        // succeed), or it is told it lost it: then c gets it.
        ensemble.wait_serving(Duration::from_secs(30)).unwrap();
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

    /// A lease outside the session timeouts the server grants (its minSessionTimeout..
    /// maxSessionTimeout, 200 ms..1 h here) is a configuration error, and leaves nothing held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_the_server_cannot_grant_is_a_config_error() {
        let server = shared();
        let b = backend(&format!("{}{}", server.url(), root())).await;
        for ms in [2 * 3_600_000, 100] {
            let err = registry(&b, lease(ms))
                .obtain("k")
                .unwrap()
                .try_lock()
                .await
                .unwrap_err();
            assert!(
                matches!(&err, Error::InvalidConfig(m) if m.contains("session")),
                "lease {ms} ms: {err:?}"
            );
        }
        assert!(b
            .contenders(&LockName::new("lock", "k").unwrap())
            .await
            .unwrap()
            .is_empty());
        // A lease the server grants works.
        registry(&b, lease(1000))
            .obtain("k")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    /// A password goes over plain TCP only when the URL says so (`allow_insecure_auth=true`); without
    /// it, the URL is refused with a configuration error that does not show the password.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn credentials_over_plain_tcp_need_the_explicit_opt_in() {
        let server = shared();
        let url = format!("zk://alice:hunter2@127.0.0.1:{}{}", server.port(), root());
        let err = ZooKeeperBackend::connect(&url).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig(m) if m.contains("allow_insecure_auth")),
            "{err:?}"
        );
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
        let b = backend(&format!("{url}?allow_insecure_auth=true")).await;
        registry(&b, RegistryOptions::default())
            .obtain("k")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
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

    /// Every distinct lease gets a session of its own, but sessions of leases nobody holds any
    /// more are closed again: forty leases one after another leave a handful of connections.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_of_leases_no_longer_held_are_closed() {
        let server = shared();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let b = backend(&format!("zk://{}{}", proxy.addr(), root())).await;
        for i in 0..40 {
            let g = registry(&b, lease(1000 + i * 10))
                .obtain("k")
                .unwrap()
                .try_lock()
                .await
                .unwrap();
            g.release().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            proxy.live_connections() <= 10,
            "{} connections for 40 leases no longer held",
            proxy.live_connections()
        );
    }
}
