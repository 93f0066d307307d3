//! The client's view of a lease never ends after the server's: it counts from before the
//! request that set the lease, and a renewal or extension that does not answer in time marks
//! the guard lost when that view ends instead of hanging.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::backends::memory::MemoryBackend;
use distlock::{
    AcquireMode, Attempt, Backend, Capabilities, Error, LockInfo, LockName, LockRegistry,
    RegistryOptions, ReleaseSubscription, Released, Token,
};
use tokio::time::Instant;

/// Memory locks over a slow network: acquisition replies take `reply_delay`; once `stall` is
/// set, extensions never answer.
#[derive(Debug, Default)]
struct Slow {
    inner: MemoryBackend,
    reply_delay: Duration,
    stall: AtomicBool,
}

#[async_trait]
impl Backend for Slow {
    fn kind(&self) -> &'static str {
        "slow"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
        mode: AcquireMode,
    ) -> distlock::Result<Attempt> {
        let a = self.inner.acquire(name, token, lease, mode).await;
        tokio::time::sleep(self.reply_delay).await;
        a
    }
    async fn release(&self, name: &LockName, token: Token) -> distlock::Result<Released> {
        self.inner.release(name, token).await
    }
    async fn extend(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
    ) -> distlock::Result<bool> {
        if self.stall.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.extend(name, token, lease).await
    }
    async fn subscribe(
        &self,
        name: &LockName,
        waiter: Token,
    ) -> distlock::Result<ReleaseSubscription> {
        self.inner.subscribe(name, waiter).await
    }
    async fn inspect(&self, name: &LockName) -> distlock::Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

fn registry(backend: Arc<Slow>, lease: Duration, renew: bool) -> LockRegistry {
    LockRegistry::from_backend(
        backend,
        RegistryOptions::default()
            .with_lease(lease)
            .with_renew(renew),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_counts_from_before_the_acquire_request() {
    let delay = Duration::from_millis(300);
    let lease = Duration::from_secs(2);
    let backend = Arc::new(Slow {
        reply_delay: delay,
        ..Slow::default()
    });
    let reg = registry(backend, lease, false);
    let guard = reg.obtain("k").unwrap().lock().await.unwrap();
    // The server's lease started before the reply's delay: the client's view must not
    // include that delay.
    assert!(
        guard.remaining() <= lease - delay,
        "the client counts {:?} left of a {lease:?} lease set {delay:?} ago",
        guard.remaining()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_never_answers_marks_the_guard_lost_by_the_lease_end() {
    let lease = Duration::from_millis(600);
    let backend = Arc::new(Slow::default());
    let reg = registry(backend.clone(), lease, true);
    let guard = reg.obtain("k").unwrap().lock().await.unwrap();
    let taken = Instant::now();
    backend.stall.store(true, Ordering::SeqCst);
    tokio::time::timeout(lease * 3, guard.lost())
        .await
        .expect("a hanging renewal must not keep the guard alive");
    // `lost` fires when the client's lease ends, which is no later than the server's.
    let lost_after = taken.elapsed();
    assert!(
        lost_after <= lease + lease / 2,
        "lost only after {lost_after:?}"
    );
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_that_never_answers_fails_by_the_lease_end() {
    let lease = Duration::from_millis(600);
    let backend = Arc::new(Slow::default());
    let reg = registry(backend.clone(), lease, false);
    let guard = reg.obtain("k").unwrap().lock().await.unwrap();
    backend.stall.store(true, Ordering::SeqCst);
    let r = tokio::time::timeout(lease * 3, guard.extend(Duration::from_secs(5)))
        .await
        .expect("extend() hung past the lease it extends");
    assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
    assert!(!guard.is_held());
}
