//! Spring mode on ZooKeeper: `zk://…?spring=true` with nothing else set shares its locks with a
//! Spring Integration `ZookeeperLockRegistry` built with its defaults, which keeps Curator
//! `InterProcessMutex` nodes under `/SpringIntegration-LockRegistry/<key>` (real Curator 5.4
//! stands in for Spring's registry, which is a thin layer over it).

mod common {
    pub mod curator;
    pub mod zookeeper;
}

use std::time::Duration;

use common::curator::{Curator, JVM_LIMIT};
use common::zookeeper::*;
use distlock::backends::zookeeper::SPRING_ROOT;
use distlock::{Error, RegistryOptions};
use tokio::time::timeout;

/// Named `zookeeper::…` so that `-E 'test(/zookeeper/)'` selects them.
mod zookeeper {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spring_mode_meets_springs_default_root() {
        let server = shared();
        let b = backend(&format!("{}?spring=true", server.url())).await;
        let reg = registry(&b, RegistryOptions::default());
        let key = format!("job-{:x}", rand_u64());
        let path = format!("{SPRING_ROOT}/{key}");
        assert_eq!(
            b.lock_path(&distlock::LockName::new("lock", &key).unwrap()),
            path
        );

        // Spring's side holds: ours is busy, and gets it when Spring lets go.
        let cs = server.connect_string();
        let mut spring = Curator::start(&cs, "mutex", &path, Duration::from_secs(30)).await;
        assert!(spring.outcome().await, "Spring's mutex on a free key");
        let lock = reg.obtain(&key).unwrap();
        match lock.try_lock().await {
            Err(Error::NotAcquired { .. }) => {}
            other => panic!("ours while Spring's holds: expected NotAcquired, got {other:?}"),
        }
        let waiter = tokio::spawn(async move { lock.lock().await });
        spring.release().await;
        let g = timeout(JVM_LIMIT, waiter)
            .await
            .expect("woken by Spring's release")
            .unwrap()
            .unwrap();
        // Ours holds: Spring's side is kept out.
        let mut other = Curator::start(&cs, "mutex", &path, Duration::from_millis(500)).await;
        assert!(!other.outcome().await, "Spring's mutex while ours holds");
        g.release().await.unwrap();
    }

    /// A root given in the URL wins over Spring's default.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_explicit_root_wins_in_spring_mode() {
        let server = shared();
        let r = root();
        let b = backend(&format!("{}{r}?spring=true", server.url())).await;
        let name = distlock::LockName::new("lock", "k").unwrap();
        assert_eq!(b.lock_path(&name), format!("{r}/k"));
        lock_and_release(&registry(&b, RegistryOptions::default()), "k").await;
    }
}
