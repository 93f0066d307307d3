//! ZooKeeper backend on real servers: Curator's layout, key mapping, FIFO and predecessor-only
//! watches, the empty parent reaped, leases and sessions, and digest authentication. Faults
//! (servers killed, sessions expired, ensembles losing members) are in `zookeeper_faults.rs`.
//!
//! The tests share one throwaway server per test process, each under its own root.

mod common {
    pub mod cost;
    pub mod curator;
    pub mod fifo;
    pub mod zookeeper;
}

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::curator::{Curator, JVM_LIMIT};
use common::fifo::{queued_attempt, spawn_waiter};
use common::zookeeper::*;
use distlock::backends::zookeeper::{zookeeper_client, ZooKeeperBackend};
use distlock::testkit::proxy::FaultProxy;
use distlock::{Attempt, Backend, Error, LockName, RegistryOptions, Token};
use tokio::time::{timeout, Instant};

/// Curator's names of readers and writers.
const READ: &str = "__READ__";
const WRITE: &str = "__WRIT__";

fn busy<T: std::fmt::Debug>(res: distlock::Result<T>, what: &str) {
    match res {
        Err(Error::NotAcquired { .. }) => {}
        other => panic!("{what}: expected NotAcquired, got {other:?}"),
    }
}

/// A test on a node's children: whether one contains `marker`.
fn has(marker: &'static str) -> impl Fn(&[String]) -> bool {
    move |c: &[String]| c.iter().any(|n| n.contains(marker))
}

/// Waits until the children of `path` pass `test` (a hang guard of [`JVM_LIMIT`]).
async fn until(
    client: &zookeeper_client::Client,
    path: &str,
    test: impl Fn(&[String]) -> bool,
    what: &str,
) {
    let started = Instant::now();
    loop {
        let children = client.list_children(path).await.unwrap_or_default();
        if test(&children) {
            return;
        }
        assert!(
            started.elapsed() < JVM_LIMIT,
            "{what}: children {children:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

    /// Not a check: prints what an uncontended read-lock cycle (and a permit's) costs beside a
    /// mutex cycle on one server. Run it with
    /// `cargo nextest run -p distlock --all-features --test zookeeper -E 'test(/cycle_costs/)'
    /// --run-ignored only --no-capture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement; prints figures"]
    async fn cycle_costs_of_the_kinds() {
        let server = shared();
        let b = backend(&format!("{}{}", server.url(), root())).await;
        let reg = registry(&b, RegistryOptions::default());
        common::cost::print_cycle_costs("zookeeper", &reg, 300).await;
    }

    /// Real Curator's `InterProcessMutex` (Debian's Curator 5.4 on the JDK) and distlock's mutex
    /// exclude each other on the same path, both ways: we queue behind Curator's node, see its
    /// czxid as the fence, get the lock when it lets go, and keep Curator out while we hold it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn curators_interprocess_mutex_and_ours_exclude_each_other() {
        let server = shared();
        let r = root();
        let b = backend(&format!("{}{r}", server.url())).await;
        let reg = registry(&b, RegistryOptions::default());
        let path = format!("{r}/job");
        let cs = server.connect_string();
        let mut curator = Curator::start(&cs, "mutex", &path, Duration::from_secs(30)).await;
        assert!(curator.outcome().await, "Curator's mutex on a free path");
        let lock = reg.obtain("job").unwrap();
        busy(lock.try_lock().await, "our mutex while Curator's holds");
        let client = b.client().await.unwrap();
        let nodes = client.list_children(&path).await.unwrap();
        assert_eq!(nodes.len(), 1, "{nodes:?}");
        assert!(is_curator_name(&nodes[0]), "{nodes:?}");
        let (_, stat) = client
            .get_data(&format!("{path}/{}", nodes[0]))
            .await
            .unwrap();
        assert_eq!(
            lock.inspect().await.unwrap().unwrap().fence,
            Some(stat.czxid as u64)
        );
        // Queued behind it; it lets go; we get it.
        let waiter = tokio::spawn(async move { lock.lock().await });
        until(&client, &path, |c| c.len() == 2, "our node queued").await;
        assert!(!waiter.is_finished());
        curator.release().await;
        let g = timeout(JVM_LIMIT, waiter)
            .await
            .expect("woken by Curator's release")
            .unwrap()
            .unwrap();
        assert!(g.fence() > (stat.czxid as u64) << 10);
        let mut other = Curator::start(&cs, "mutex", &path, Duration::from_millis(500)).await;
        assert!(!other.outcome().await, "Curator's mutex while ours holds");
        g.release().await.unwrap();
    }

    /// Curator's readers and ours share a key; a writer of either side is kept out while they
    /// read, and so is our mutex.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn curators_readers_and_ours_share_the_key() {
        let server = shared();
        let r = root();
        let url = format!("{}{r}", server.url());
        let (a, b) = (backend(&url).await, backend(&url).await);
        let (areg, breg) = (
            registry(&a, RegistryOptions::default()),
            registry(&b, RegistryOptions::default()),
        );
        let path = format!("{r}/doc");
        let cs = server.connect_string();
        let mut reader = Curator::start(&cs, "read", &path, Duration::from_secs(30)).await;
        assert!(reader.outcome().await, "Curator's reader on a free path");
        let ours = areg
            .read_write("doc")
            .unwrap()
            .read()
            .try_lock()
            .await
            .expect("our reader beside Curator's");
        busy(
            breg.read_write("doc").unwrap().write().try_lock().await,
            "our writer while Curator and we read",
        );
        busy(
            breg.obtain("doc").unwrap().try_lock().await,
            "our mutex while Curator and we read",
        );
        let mut writer = Curator::start(&cs, "write", &path, Duration::from_millis(500)).await;
        assert!(!writer.outcome().await, "Curator's writer while we read");
        let info = breg
            .obtain("doc")
            .unwrap()
            .inspect()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (info.kind, info.holders),
            (Some(distlock::LockKind::Read), Some(2))
        );
        reader.release().await;
        // And the other way round: Curator's reader joins ours.
        let mut reader = Curator::start(&cs, "read", &path, Duration::from_secs(30)).await;
        assert!(reader.outcome().await, "Curator's reader beside ours");
        ours.release().await.unwrap();
        reader.release().await;
    }

    /// A writer of either side keeps out every reader and writer of the other (and our mutex),
    /// and a writer that waits keeps new readers of the other side out (writer preference
    /// comes from the order of the nodes).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn curators_writer_and_ours_exclude_every_other_holder() {
        let server = shared();
        let r = root();
        let url = format!("{}{r}", server.url());
        let (a, b) = (backend(&url).await, backend(&url).await);
        let (areg, breg) = (
            registry(&a, RegistryOptions::default()),
            registry(&b, RegistryOptions::default()),
        );
        let client = a.client().await.unwrap();
        let path = format!("{r}/doc");
        let cs = server.connect_string();
        let mut writer = Curator::start(&cs, "write", &path, Duration::from_secs(30)).await;
        assert!(writer.outcome().await);
        let rw = areg.read_write("doc").unwrap();
        busy(
            rw.read().try_lock().await,
            "our reader beside Curator's writer",
        );
        busy(
            rw.write().try_lock().await,
            "our writer beside Curator's writer",
        );
        busy(
            areg.obtain("doc").unwrap().try_lock().await,
            "our mutex beside Curator's writer",
        );
        // Our reader waits for it and gets in when it leaves.
        let waiter = tokio::spawn({
            let rw = rw.clone();
            async move { rw.read().lock().await }
        });
        until(&client, &path, |c| c.len() == 2, "our reader queued").await;
        writer.release().await;
        let ours = timeout(JVM_LIMIT, waiter)
            .await
            .expect("our reader woken by Curator's writer leaving")
            .unwrap()
            .unwrap();
        // Curator's writer waits for our reader, and keeps our new readers out meanwhile.
        let mut writer = Curator::start(&cs, "write", &path, Duration::from_secs(60)).await;
        until(&client, &path, has(WRITE), "Curator's writer queued").await;
        assert!(writer.waiting(), "Curator's writer beside our reader");
        busy(
            breg.read_write("doc").unwrap().read().try_lock().await,
            "our new reader behind Curator's waiting writer",
        );
        ours.release().await.unwrap();
        assert!(
            writer.outcome().await,
            "Curator's writer after our reader left"
        );
        writer.release().await;

        // Our writer keeps out Curator's readers and writers ...
        let w = rw
            .write()
            .try_lock()
            .await
            .expect("our writer on a free key");
        let mut reader = Curator::start(&cs, "read", &path, Duration::from_millis(500)).await;
        assert!(
            !reader.outcome().await,
            "Curator's reader beside our writer"
        );
        let mut writer = Curator::start(&cs, "write", &path, Duration::from_millis(500)).await;
        assert!(!writer.outcome().await, "Curator's writer beside ours");
        // ... and a Curator reader that waits gets in once it leaves.
        let mut reader = Curator::start(&cs, "read", &path, Duration::from_secs(60)).await;
        until(&client, &path, has(READ), "Curator's reader queued").await;
        assert!(reader.waiting(), "Curator's reader beside our writer");
        // Our new readers queue behind our writer too (nothing jumps the queue).
        busy(
            breg.read_write("doc").unwrap().read().try_lock().await,
            "our reader beside our writer",
        );
        w.release().await.unwrap();
        assert!(
            reader.outcome().await,
            "Curator's reader after our writer left"
        );
        reader.release().await;
    }

    /// Curator's `InterProcessMutex` and `InterProcessReadWriteLock` on one path ignore each
    /// other (Curator's behaviour: each sorts the other's names after its own); distlock's
    /// kinds see both: our readers and writers wait for Curator's mutex, our mutex waits for
    /// Curator's readers and writers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn curators_mutex_and_read_write_lock_ignore_each_other_but_ours_see_both() {
        let server = shared();
        let r = root();
        let b = backend(&format!("{}{r}", server.url())).await;
        let reg = registry(&b, RegistryOptions::default());
        let path = format!("{r}/mixed");
        let cs = server.connect_string();
        let mut mutex = Curator::start(&cs, "mutex", &path, Duration::from_secs(30)).await;
        assert!(mutex.outcome().await);
        let rw = reg.read_write("mixed").unwrap();
        busy(
            rw.read().try_lock().await,
            "our reader beside Curator's mutex",
        );
        busy(
            rw.write().try_lock().await,
            "our writer beside Curator's mutex",
        );
        // Curator's own reader does not see Curator's mutex.
        let mut reader = Curator::start(&cs, "read", &path, Duration::from_secs(30)).await;
        assert!(
            reader.outcome().await,
            "Curator's reader beside Curator's mutex (Curator's own behaviour)"
        );
        mutex.release().await;
        busy(
            reg.obtain("mixed").unwrap().try_lock().await,
            "our mutex beside Curator's reader",
        );
        reader.release().await;
        let mut writer = Curator::start(&cs, "write", &path, Duration::from_secs(30)).await;
        assert!(writer.outcome().await);
        busy(
            reg.obtain("mixed").unwrap().try_lock().await,
            "our mutex beside Curator's writer",
        );
        writer.release().await;
        reg.obtain("mixed")
            .unwrap()
            .try_lock()
            .await
            .expect("free again")
            .release()
            .await
            .unwrap();
    }

    /// Curator's `InterProcessSemaphoreV2` and ours share the count: together they never hold
    /// more than its permits, a distlock waiter that holds Curator's `locks` mutex while it
    /// waits lets a Curator taker queue behind it (no deadlock), and permits go round between
    /// both sides.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn curators_permits_and_ours_never_exceed_the_count() {
        let server = shared();
        let r = root();
        let url = format!("{}{r}", server.url());
        let (a, b) = (backend(&url).await, backend(&url).await);
        let (areg, breg) = (
            registry(&a, RegistryOptions::default()),
            registry(&b, RegistryOptions::default()),
        );
        let client = a.client().await.unwrap();
        let path = format!("{r}/pool");
        let leases = format!("{path}/leases");
        let locks = format!("{path}/locks");
        let cs = server.connect_string();
        let mut c1 = Curator::start(&cs, "sem:2", &path, Duration::from_secs(30)).await;
        assert!(c1.outcome().await);
        let p1 = areg
            .semaphore("pool", 2)
            .unwrap()
            .try_lock()
            .await
            .expect("our permit beside Curator's");
        busy(
            breg.semaphore("pool", 2).unwrap().try_lock().await,
            "a third permit (ours)",
        );
        let mut c2 = Curator::start(&cs, "sem:2", &path, Duration::from_millis(500)).await;
        assert!(!c2.outcome().await, "a third permit (Curator's)");
        assert_eq!(client.list_children(&leases).await.unwrap().len(), 2);
        let info = areg
            .obtain("pool")
            .unwrap()
            .inspect()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.holders, Some(2));

        // Our waiter takes Curator's `locks` mutex and waits with its lease; a Curator taker
        // queues behind it on that mutex.
        let waiter = tokio::spawn({
            let sem = breg.semaphore("pool", 2).unwrap();
            async move { sem.lock().await }
        });
        until(&client, &leases, |c| c.len() == 3, "our waiting lease").await;
        let mut c3 = Curator::start(&cs, "sem:2", &path, Duration::from_secs(60)).await;
        until(&client, &locks, |c| c.len() == 2, "Curator queued on locks").await;
        c1.release().await;
        let p2 = timeout(JVM_LIMIT, waiter)
            .await
            .expect("our waiter gets the permit Curator gave back")
            .unwrap()
            .unwrap();
        // Curator's taker now waits with its lease for one of the two permits we hold.
        until(
            &client,
            &leases,
            |c| c.len() == 3,
            "Curator's waiting lease",
        )
        .await;
        assert!(c3.waiting(), "a third permit for Curator");
        p1.release().await.unwrap();
        assert!(
            c3.outcome().await,
            "Curator's taker after our permit came back"
        );
        busy(
            areg.semaphore("pool", 2).unwrap().try_lock().await,
            "a third permit beside ours and Curator's",
        );
        assert_eq!(client.list_children(&leases).await.unwrap().len(), 2);
        p2.release().await.unwrap();
        c3.release().await;
        // A distlock taker with another count is refused beside our holder (Curator records
        // no count, so beside Curator's holders only the number of leases decides).
        let p = areg.semaphore("pool", 2).unwrap().try_lock().await.unwrap();
        match breg.semaphore("pool", 3).unwrap().try_lock().await {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains("permit"), "{msg}"),
            other => panic!("a taker with another count got {other:?}"),
        }
        p.release().await.unwrap();
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
