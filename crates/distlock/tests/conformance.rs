//! The conformance suite on every backend this build has: memory, Redis (a throwaway
//! `redis-server` per test), Redlock (three of them), Sentinel (a master, two replicas, three
//! Sentinels), Redis Cluster (three masters, a replica each), SQLite (a fresh database file per test), PostgreSQL and
//! MariaDB, each also in Spring mode and in ShedLock's layout (a fresh database per test on the machine's server, or on
//! a throwaway server the test process starts when none runs), ZooKeeper and etcd (a
//! throwaway server per test process). Each harness is reached by URL, so the lost-signal
//! scenarios delete locks with `Backend::force_release` and the cross-process scenarios start
//! children on the same URL.

use std::sync::Arc;

use distlock::backends::memory::MemoryBackend;
use distlock::Backend;
use distlock_testkit::conformance::Harness;
use distlock_testkit::redis::RedisServer;

/// One backend shared by every registry of a test (it is in-process).
async fn memory() -> Harness {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    Harness::new(move || {
        let b = backend.clone();
        async move { Ok(b) }
    })
}

async fn redis() -> Harness {
    let server =
        RedisServer::start().expect("redis-server must be installed (scripts/test.sh installs it)");
    Harness::connect(server.url()).keep_alive(server)
}

/// Redlock over three throwaway servers.
async fn redlock() -> Harness {
    let nodes = RedisServer::start_independent(3)
        .expect("redis-server must be installed (scripts/test.sh installs it)");
    Harness::connect(RedisServer::redlock_url(&nodes)).keep_alive(nodes)
}

/// Redis under Sentinel: a master, two replicas and three Sentinels; acquisitions wait for one
/// replica. No scenario fails the master over (`tests/redis_sentinel.rs` does), so the set is
/// used before the Sentinels have discovered each other.
async fn redis_sentinel() -> Harness {
    use distlock_testkit::redis::sentinel::{SentinelOptions, SentinelSet};
    let options = SentinelOptions {
        no_failover: true,
        ..SentinelOptions::default()
    };
    let set = tokio::task::block_in_place(|| SentinelSet::start_with(2, options))
        .expect("redis-server must be installed (scripts/test.sh installs it)");
    Harness::connect(set.url()).keep_alive(set)
}

/// Redis Cluster: three masters with a replica each; acquisitions wait for one replica.
async fn redis_cluster() -> Harness {
    use distlock_testkit::redis::cluster::ClusterSet;
    let set = tokio::task::block_in_place(ClusterSet::start)
        .expect("redis-server must be installed (scripts/test.sh installs it)");
    Harness::connect(set.url()).keep_alive(set)
}

async fn sqlite() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    Harness::connect(url).keep_alive(dir)
}

#[cfg(feature = "postgres")]
async fn postgres_with(query: &str) -> Harness {
    use distlock_testkit::postgres::PostgresServer;
    let server = PostgresServer::machine_or_start()
        .expect("PostgreSQL must run or be installed (scripts/test.sh installs postgresql)");
    let db = server.fresh_database().expect("fresh database");
    Harness::connect(format!("{}{query}", db.url())).keep_alive(db)
}

#[cfg(feature = "mysql")]
async fn mariadb_with(query: &str) -> Harness {
    use distlock_testkit::mysql::MariaDbServer;
    let server = MariaDbServer::machine_or_start()
        .expect("MariaDB must run or be installed (scripts/test.sh installs mariadb-server)");
    let db = server.fresh_database().expect("fresh database");
    Harness::connect(format!("{}{query}", db.url())).keep_alive(db)
}

/// ZooKeeper: one throwaway server per test process; every scenario has its own root
/// (`/<random prefix>`).
#[cfg(feature = "zookeeper")]
async fn zookeeper() -> Harness {
    use distlock::backends::zookeeper::ZooKeeperBackend;
    use distlock_testkit::zookeeper::ZooKeeperServer;
    let server = ZooKeeperServer::shared()
        .expect("ZooKeeper must be installed (scripts/test.sh installs zookeeper)");
    let url = server.url();
    // A fresh JVM answers its first requests slowly; timing scenarios want a warm server.
    static WARM: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    WARM.get_or_init(|| async {
        let b = ZooKeeperBackend::connect(&url).await.expect("connect");
        let reg = distlock::LockRegistry::new(b);
        for _ in 0..20 {
            let g = reg.obtain("warm-up").unwrap().lock().await.unwrap();
            g.release().await.unwrap();
        }
    })
    .await;
    Harness::connect(url).keep_alive(server)
}

/// etcd: one throwaway single-node server per test process; every scenario has its own prefix.
#[cfg(feature = "etcd")]
async fn etcd() -> Harness {
    use distlock_testkit::etcd::EtcdServer;
    let server = EtcdServer::shared()
        .expect("etcd must be installed (scripts/test.sh installs etcd-server)");
    Harness::connect(server.url()).keep_alive(server)
}

// One line per backend: the suite's name (its tests are `<name>::<scenario>`) and its harness.
distlock_testkit::conformance_suite!(on_memory, memory);
distlock_testkit::conformance_suite!(on_redis, redis);
distlock_testkit::conformance_suite!(on_redlock, redlock);
distlock_testkit::conformance_suite!(on_redis_sentinel, redis_sentinel);
distlock_testkit::conformance_suite!(on_redis_cluster, redis_cluster);
distlock_testkit::conformance_suite!(on_sqlite, sqlite);
#[cfg(feature = "postgres")]
distlock_testkit::conformance_suite!(on_postgres, || postgres_with(""));
#[cfg(feature = "postgres")]
distlock_testkit::conformance_suite!(on_postgres_spring, || postgres_with("?spring=true"));
#[cfg(feature = "postgres")]
distlock_testkit::conformance_suite!(on_postgres_shedlock, || postgres_with("?layout=shedlock"));
#[cfg(feature = "mysql")]
distlock_testkit::conformance_suite!(on_mariadb, || mariadb_with(""));
#[cfg(feature = "mysql")]
distlock_testkit::conformance_suite!(on_mariadb_spring, || mariadb_with("?spring=true"));
#[cfg(feature = "mysql")]
distlock_testkit::conformance_suite!(on_mariadb_shedlock, || mariadb_with("?layout=shedlock"));
#[cfg(feature = "zookeeper")]
distlock_testkit::conformance_suite!(on_zookeeper, zookeeper);
#[cfg(feature = "etcd")]
distlock_testkit::conformance_suite!(on_etcd, etcd);
