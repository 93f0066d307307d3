//! The conformance suite on every backend this build has: memory, Redis (a throwaway
//! `redis-server` per test), SQLite (a fresh database file per test), and PostgreSQL and
//! MariaDB (a fresh database per test on the machine's server, or on a throwaway server the
//! test process starts when none runs).

use std::sync::Arc;

use distlock::backends::memory::MemoryBackend;
use distlock::backends::redis::RedisBackend;
use distlock::backends::sqlite::SqliteBackend;
use distlock::conformance::Harness;
use distlock::testkit::redis::RedisServer;
use distlock::Backend;

async fn memory() -> Harness {
    let backend = Arc::new(MemoryBackend::new());
    let deleter = backend.clone();
    Harness::new(move || {
        let b: Arc<dyn Backend> = backend.clone();
        async move { Ok(b) }
    })
    .with_deleter(move |name| {
        let deleter = deleter.clone();
        async move {
            deleter.force_release(&name).await.expect("force release");
        }
    })
}

async fn redis() -> Harness {
    let server =
        RedisServer::start().expect("redis-server must be installed (scripts/test.sh installs it)");
    let url = server.url();
    let server = Arc::new(server);
    let s = server.clone();
    Harness::new(move || {
        let url = url.clone();
        async move {
            RedisBackend::connect(&url)
                .await
                .map(|b| Arc::new(b) as Arc<dyn Backend>)
        }
    })
    .with_deleter(move |name| {
        let s = s.clone();
        async move {
            s.cli(&["DEL", &format!("{}:{}", name.prefix(), name.key())])
                .expect("DEL");
        }
    })
    .keep_alive(server)
}

async fn sqlite() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let p = path.clone();
    Harness::new(move || {
        let p = p.clone();
        async move { SqliteBackend::open(&p).map(|b| Arc::new(b) as Arc<dyn Backend>) }
    })
    .with_deleter(move |name| {
        let path = path.clone();
        async move {
            let other = SqliteBackend::open(&path).expect("open");
            other.force_release(&name).await.expect("delete row");
        }
    })
    .keep_alive(dir)
}

#[cfg(feature = "postgres")]
async fn postgres_with(spring: bool) -> Harness {
    use distlock::backends::postgres::PostgresBackend;
    use distlock::testkit::postgres::PostgresServer;
    let server = PostgresServer::machine_or_start()
        .expect("PostgreSQL must run or be installed (scripts/test.sh installs postgresql)");
    let db = server.fresh_database().expect("fresh database");
    let url = if spring {
        format!("{}?spring=true", db.url())
    } else {
        db.url().to_owned()
    };
    let deleter_url = url.clone();
    Harness::new(move || {
        let url = url.clone();
        async move {
            PostgresBackend::connect(&url)
                .await
                .map(|b| Arc::new(b) as Arc<dyn Backend>)
        }
    })
    .with_deleter(move |name| {
        let url = deleter_url.clone();
        async move {
            let other = PostgresBackend::connect(&url).await.expect("connect");
            assert!(other.force_release(&name).await.expect("delete row"));
        }
    })
    .keep_alive(db)
}

#[cfg(feature = "postgres")]
async fn postgres() -> Harness {
    postgres_with(false).await
}

#[cfg(feature = "postgres")]
async fn postgres_spring() -> Harness {
    postgres_with(true).await
}

#[cfg(feature = "mysql")]
async fn mariadb_with(spring: bool) -> Harness {
    use distlock::backends::mysql::MySqlBackend;
    use distlock::testkit::mysql::MariaDbServer;
    let server = MariaDbServer::machine_or_start()
        .expect("MariaDB must run or be installed (scripts/test.sh installs mariadb-server)");
    let db = server.fresh_database().expect("fresh database");
    let url = if spring {
        format!("{}?spring=true", db.url())
    } else {
        db.url().to_owned()
    };
    let deleter_url = url.clone();
    Harness::new(move || {
        let url = url.clone();
        async move {
            MySqlBackend::connect(&url)
                .await
                .map(|b| Arc::new(b) as Arc<dyn Backend>)
        }
    })
    .with_deleter(move |name| {
        let url = deleter_url.clone();
        async move {
            let other = MySqlBackend::connect(&url).await.expect("connect");
            assert!(other.force_release(&name).await.expect("delete row"));
        }
    })
    .keep_alive(db)
}

#[cfg(feature = "mysql")]
async fn mariadb() -> Harness {
    mariadb_with(false).await
}

#[cfg(feature = "mysql")]
async fn mariadb_spring() -> Harness {
    mariadb_with(true).await
}

/// ZooKeeper: one throwaway server per test process; every scenario has its own root
/// (`/<random prefix>`). The deleter removes the holder's node from another session.
#[cfg(feature = "zookeeper")]
async fn zookeeper() -> Harness {
    use distlock::backends::zookeeper::ZooKeeperBackend;
    use distlock::testkit::zookeeper::ZooKeeperServer;
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
    let deleter_url = url.clone();
    Harness::new(move || {
        let url = url.clone();
        async move {
            ZooKeeperBackend::connect(&url)
                .await
                .map(|b| Arc::new(b) as Arc<dyn Backend>)
        }
    })
    .with_deleter(move |name| {
        let url = deleter_url.clone();
        async move {
            let other = ZooKeeperBackend::connect(&url).await.expect("connect");
            let deleted = other.force_release(&name).await;
            assert!(deleted.expect("delete the holder's node"));
        }
    })
    .keep_alive(server)
}

/// etcd: one throwaway single-node server per test process; every scenario has its own prefix.
/// The deleter removes the holder's key (the lowest create revision) from another connection.
#[cfg(feature = "etcd")]
async fn etcd() -> Harness {
    use distlock::backends::etcd::EtcdBackend;
    use distlock::testkit::etcd::EtcdServer;
    let server = EtcdServer::shared()
        .expect("etcd must be installed (scripts/test.sh installs etcd-server)");
    let url = server.url();
    let deleter_url = url.clone();
    Harness::new(move || {
        let url = url.clone();
        async move {
            EtcdBackend::connect(&url)
                .await
                .map(|b| Arc::new(b) as Arc<dyn Backend>)
        }
    })
    .with_deleter(move |name| {
        let url = deleter_url.clone();
        async move {
            let other = EtcdBackend::connect(&url).await.expect("connect");
            assert!(other
                .force_release(&name)
                .await
                .expect("delete the holder's key"));
        }
    })
    .keep_alive(server)
}

distlock::conformance_suite!(on_memory, memory);
distlock::conformance_suite!(on_redis, redis);
distlock::conformance_suite!(on_sqlite, sqlite);
#[cfg(feature = "postgres")]
distlock::conformance_suite!(on_postgres, postgres);
#[cfg(feature = "postgres")]
distlock::conformance_suite!(on_postgres_spring, postgres_spring);
#[cfg(feature = "mysql")]
distlock::conformance_suite!(on_mariadb, mariadb);
#[cfg(feature = "mysql")]
distlock::conformance_suite!(on_mariadb_spring, mariadb_spring);
#[cfg(feature = "zookeeper")]
distlock::conformance_suite!(on_zookeeper, zookeeper);
#[cfg(feature = "etcd")]
distlock::conformance_suite!(on_etcd, etcd);
