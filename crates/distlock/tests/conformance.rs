//! The conformance suite on every backend this build has: memory, Redis (a throwaway
//! `redis-server` per test) and SQLite (a fresh database file per test).

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

distlock::conformance_suite!(on_memory, memory);
distlock::conformance_suite!(on_redis, redis);
distlock::conformance_suite!(on_sqlite, sqlite);
