//! The renewal task lives on a runtime; when that runtime is gone, holds taken on another one
//! must still be renewed.

use std::sync::Arc;
use std::time::Duration;

use distlock::backends::memory::MemoryBackend;
use distlock::backends::redis::RedisBackend;
use distlock::{Backend, LockRegistry, RegistryOptions};
use distlock_testkit::redis::RedisServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Runtime A takes and releases a lock (starting the renewal task there) and is dropped;
/// runtime B then holds a lock of the same registry for four leases.
fn holds_survive_the_runtime_that_started_renewal(
    registry: LockRegistry,
    lease: Duration,
    holder_on_server: impl Fn() -> bool,
) {
    let a = runtime();
    a.block_on(async {
        let g = registry.obtain("first").unwrap().lock().await.unwrap();
        g.release().await.unwrap();
    });
    drop(a);

    let b = runtime();
    b.block_on(async {
        let guard = registry.obtain("second").unwrap().lock().await.unwrap();
        tokio::time::sleep(lease * 4).await;
        assert!(
            guard.is_held(),
            "not renewed after the first runtime was dropped"
        );
        let seen = registry.obtain("second").unwrap().inspect().await.unwrap();
        assert!(seen.is_some(), "the backend no longer has the lock");
        assert!(holder_on_server(), "the server no longer has the lock");
        guard.release().await.expect("still held at release");
    });
}

#[test]
fn memory_holds_are_renewed_after_the_first_runtime_is_dropped() {
    let backend = Arc::new(MemoryBackend::new());
    let lease = Duration::from_millis(300);
    let registry = LockRegistry::from_backend(
        backend.clone(),
        RegistryOptions::default()
            .with_prefix("rt")
            .with_lease(lease),
    )
    .unwrap();
    holds_survive_the_runtime_that_started_renewal(registry, lease, || true);
}

#[test]
fn redis_holds_are_renewed_after_the_first_runtime_is_dropped() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let lease = Duration::from_millis(500);
    let setup = runtime();
    let backend: Arc<dyn Backend> = Arc::new(
        setup
            .block_on(RedisBackend::connect(&server.url()))
            .unwrap(),
    );
    drop(setup);
    let registry = LockRegistry::from_backend(
        backend,
        RegistryOptions::default()
            .with_prefix("rt")
            .with_lease(lease),
    )
    .unwrap();
    holds_survive_the_runtime_that_started_renewal(registry, lease, || {
        server.cli(&["EXISTS", "rt:second"]).unwrap() == "1"
    });
}
