//! Helpers shared by the Redis test binaries.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::backends::redis::RedisBackend;
use distlock::{Error, LockGuard, LockRegistry, RegistryOptions};

/// Takes `lock` and releases it at once, so that its release is published.
pub async fn take_and_release(lock: distlock::Result<distlock::Lock>) {
    lock.unwrap().lock().await.unwrap().release().await.unwrap();
}

/// A registry with `options` on a new backend for `url`.
pub async fn registry_with(url: &str, options: RegistryOptions) -> LockRegistry {
    let backend = RedisBackend::connect(url).await.expect("connect");
    LockRegistry::from_backend(Arc::new(backend), options).unwrap()
}

/// A registry with leases of `lease` on a new backend for `url`.
pub async fn registry(url: &str, lease: Duration) -> LockRegistry {
    registry_with(url, RegistryOptions::default().with_lease(lease)).await
}

/// A holder and a waiter on `url` with 60 s leases, the waiter polling only every `poll`: in
/// the tests of wake-ups, only a notification wakes it in time.
pub async fn holder_and_slow_waiter(
    url: &str,
    poll: Duration,
) -> (LockRegistry, Arc<LockRegistry>) {
    let options = RegistryOptions::default()
        .with_lease(Duration::from_secs(60))
        .with_max_poll_interval(poll);
    let holder = registry_with(url, options.clone()).await;
    let waiter = Arc::new(registry_with(url, options).await);
    (holder, waiter)
}

/// Awaits `waiting`, a waiter's `lock()`, which must have returned within `bound` of
/// `released` (`what` names it in the failure), and releases what it got.
pub async fn woken_within(
    waiting: tokio::task::JoinHandle<distlock::Result<LockGuard>>,
    released: Instant,
    bound: Duration,
    what: &str,
) {
    let g = tokio::time::timeout(bound, waiting)
        .await
        .unwrap_or_else(|_| panic!("{what} was not woken within {bound:?}"))
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < bound);
    g.release().await.unwrap();
}

/// Asking for more replicas (`min_replicas`) than the set at `url` has fails as unavailable,
/// naming the parameter, and holds nothing: a registry without it gets the lock at once.
pub async fn min_replicas_beyond_the_replicas(url: &str, min_replicas: u32) {
    let asking = format!("{url}?min_replicas={min_replicas}&replica_timeout=200ms");
    let reg = registry(&asking, Duration::from_secs(5)).await;
    match reg.obtain("job").unwrap().try_lock().await {
        Err(Error::Unavailable { message, .. }) => {
            assert!(message.contains("min_replicas"), "{message}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let default = registry(url, Duration::from_secs(5)).await;
    let g = tokio::time::timeout(
        Duration::from_secs(10),
        default.obtain("job").unwrap().lock(),
    )
    .await
    .expect("the failed attempt's token was given back")
    .unwrap();
    g.release().await.unwrap();
}

/// Repeats `attempt` while it fails as `Unavailable` (a failover under way, a connection to a
/// demoted or dead master, an acquisition no replica acknowledged yet), at most `tries` times
/// 100 ms apart.
pub async fn while_unavailable<T, F, Fut>(tries: u32, mut attempt: F) -> distlock::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = distlock::Result<T>>,
{
    for _ in 0..tries {
        match attempt().await {
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            r => return r,
        }
    }
    panic!(
        "still unavailable after {:?}",
        Duration::from_millis(100) * tries
    )
}

/// Takes `job`, retrying while acquisitions are not yet replicated (the registry gives the
/// token of a failed one back).
pub async fn take_when_replicated(reg: &LockRegistry) -> LockGuard {
    let job = reg.obtain("job").unwrap();
    while_unavailable(100, || job.lock())
        .await
        .expect("acquired")
}

/// One `try_lock` of `job` on `reg`, repeated while it fails as `Unavailable`, at most `tries`
/// times: requests during and right after a failover may meet a set that is down, or a
/// connection to the old master.
pub async fn try_after_failover(reg: &LockRegistry, tries: u32) -> distlock::Result<LockGuard> {
    let job = reg.obtain("job").unwrap();
    while_unavailable(tries, || job.try_lock()).await
}

/// The next holder of `job` on `reg`, once its hold is replicated, gets a fence above
/// `first`.
pub async fn next_fence_above(reg: &LockRegistry, first: u64) {
    let next = take_when_replicated(reg).await;
    assert!(next.fence() > first, "fence {} after {first}", next.fence());
    next.release().await.unwrap();
}

/// Extends `g` by `lease`, retried while the set is still settling after a failover.
pub async fn extend_after_failover(g: &LockGuard, lease: Duration, tries: u32) {
    while_unavailable(tries, || g.extend(lease))
        .await
        .expect("extended on the new master");
}
