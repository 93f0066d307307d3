//! ZooKeeper backend on real servers: Curator's layout, key mapping, FIFO and predecessor-only
//! watches, the empty parent reaped, leases and sessions, and digest authentication. Faults
//! (servers killed, sessions expired, ensembles losing members) are in `zookeeper_faults.rs`.
//! Curator interop is in `zookeeper_suite/curator.rs`, the queue in `zookeeper_suite/fifo.rs`,
//! access and set-up (authentication, URLs, leases) in `zookeeper_suite/access.rs`.
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
use distlock::{Attempt, Backend, Error, LockName, RegistryOptions, Token};
use distlock_testkit::proxy::FaultProxy;
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

#[path = "zookeeper_suite/access.rs"]
mod zookeeper_access;
#[path = "zookeeper_suite/curator.rs"]
mod zookeeper_curator;
#[path = "zookeeper_suite/fifo.rs"]
mod zookeeper_fifo;

/// Named `zookeeper::…` (and the parts `zookeeper_…::…`) so that `-E 'test(/zookeeper/)'`
/// selects them.
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
        // The waiter's first attempt is a try, whose node goes again right after its listing:
        // the queued node is the one its waiter then marks (`distlock-waiting:`), so the
        // listing is taken once the second node carries that mark.
        let client = b.client().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let (nodes, holder, queued) = loop {
            let n = b.contenders(&name).await.unwrap();
            if let [first, second] = &n[..] {
                let h = client.get_data(&format!("/lock/{key}/{first}")).await;
                let q = client.get_data(&format!("/lock/{key}/{second}")).await;
                if let (Ok((_, h)), Ok((data, q))) = (h, q) {
                    if data.starts_with(b"distlock-waiting:") {
                        break (n, h, q);
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no marked waiter's node behind the holder's: {n:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        for n in &nodes {
            assert!(is_curator_name(n), "{n:?} is not _c_<uuid>-lock-<seq>");
        }
        // Ephemeral nodes of two different sessions; the holder's czxid is the fence.
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
