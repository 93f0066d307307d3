//! The Redis backend's table of wake-up channels stays bounded however many acquisitions wait.

use std::sync::Arc;
use std::time::Duration;

use distlock::backends::redis::RedisBackend;
use distlock::{LockRegistry, RegistryOptions};
use distlock_testkit::redis::RedisServer;
use tokio::time::Instant;

const KEY: &str = "job";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_cycles_on_one_key_keep_the_wake_up_table_bounded() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let backend = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let opts = || RegistryOptions::default().with_prefix("wake");
    let a = LockRegistry::from_backend(backend.clone(), opts()).unwrap();
    let b = LockRegistry::from_backend(backend.clone(), opts()).unwrap();
    let cycles = 300;
    let mut contended = 0;
    for i in 0..cycles {
        let (holder, waiter) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let held = holder.obtain(KEY).unwrap().lock().await.unwrap();
        let lock = waiter.obtain(KEY).unwrap();
        let waiting = tokio::spawn(async move { lock.lock().await });
        // Let the waiter find it busy and subscribe to its wake-up before the release.
        let until = Instant::now() + Duration::from_secs(2);
        while backend.wake_channels() < 2 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if backend.wake_channels() >= 2 {
            contended += 1;
        }
        held.release().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiter gets the lock")
            .unwrap()
            .unwrap();
        next.release().await.unwrap();
    }
    assert!(
        contended > cycles / 2,
        "only {contended} of {cycles} cycles were contended"
    );
    // One entry for the key itself; the waiters' own channels go with their acquisitions.
    assert!(
        backend.wake_channels() <= 2,
        "{} wake-up channels after {cycles} contended cycles on one key",
        backend.wake_channels()
    );
}
