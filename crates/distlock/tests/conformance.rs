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
        deleter.force_delete(&name);
        async {}
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
            other.force_delete(&name).await.expect("delete row");
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
            assert!(other.force_delete(&name).await.expect("delete row"));
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
            assert!(other.force_delete(&name).await.expect("delete row"));
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
