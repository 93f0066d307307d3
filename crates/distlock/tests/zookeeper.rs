//! ZooKeeper backend on real servers: Curator's layout, key mapping, FIFO and predecessor-only
//! watches, the empty parent reaped, leases and sessions, and digest authentication. Faults
//! (servers killed, sessions expired, ensembles losing members) are in `zookeeper_faults.rs`.
//!
//! The tests share one throwaway server per test process, each under its own root.

mod common {
    pub mod fifo;
    pub mod zookeeper;
}

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fifo::{queued_attempt, spawn_waiter};
use common::zookeeper::*;
use distlock::backends::zookeeper::{zookeeper_client, ZooKeeperBackend};
use distlock::testkit::proxy::FaultProxy;
use distlock::{Attempt, Backend, Error, LockName, RegistryOptions, Token};
use tokio::time::{timeout, Instant};

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
        let acl = acl(&alice, &format!("{r}/k")).await;
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
        lock_and_release(&alice2, "k").await;
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
        lock_and_release(&registry(&b, lease(1000)), "k").await;
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
        lock_and_release(&registry(&b, RegistryOptions::default()), "k").await;
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
