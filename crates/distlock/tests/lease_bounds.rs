//! The client's view of a lease never ends after the server's: it counts from before the
//! request that set the lease, and a renewal or extension that does not answer in time marks
//! the guard lost when that view ends instead of hanging.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::backends::memory::MemoryBackend;
use distlock::{
    AcquireRequest, Attempt, Backend, Error, LockName, LockRegistry, RegistryOptions, Token,
};
use tokio::time::Instant;

use distlock_testkit::hooked::{Hooked, Hooks};

/// A slow network: acquisition replies take `reply_delay`, and the next one `late_once_ms`
/// more; once `stall` is set, extensions never answer.
#[derive(Debug, Default)]
struct SlowNet {
    reply_delay: Duration,
    late_once_ms: AtomicU64,
    stall: AtomicBool,
}

/// Memory locks over [`SlowNet`].
type Slow = Hooked<SlowNet>;

#[async_trait]
impl Hooks for SlowNet {
    async fn acquire(
        &self,
        inner: &Arc<dyn Backend>,
        request: &AcquireRequest,
    ) -> distlock::Result<Attempt> {
        let a = inner.acquire(request).await;
        let late = Duration::from_millis(self.late_once_ms.swap(0, Ordering::SeqCst));
        tokio::time::sleep(self.reply_delay + late).await;
        a
    }
    async fn extend(
        &self,
        inner: &Arc<dyn Backend>,
        name: &LockName,
        token: Token,
        lease: Duration,
    ) -> distlock::Result<bool> {
        if self.stall.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        inner.extend(name, token, lease).await
    }
}

/// Memory locks over `net`.
fn slow_net(net: SlowNet) -> Arc<Slow> {
    Arc::new(Hooked::wrap(Arc::new(MemoryBackend::new()), net))
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
    let backend = slow_net(SlowNet {
        reply_delay: delay,
        ..SlowNet::default()
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
    let backend = slow_net(SlowNet::default());
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
    let backend = slow_net(SlowNet::default());
    let reg = registry(backend.clone(), lease, false);
    let guard = reg.obtain("k").unwrap().lock().await.unwrap();
    backend.stall.store(true, Ordering::SeqCst);
    let r = tokio::time::timeout(lease * 3, guard.extend(Duration::from_secs(5)))
        .await
        .expect("extend() hung past the lease it extends");
    assert!(matches!(r, Err(Error::LockLost { .. })), "{r:?}");
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_answered_after_its_lease_is_not_a_guard() {
    // The server grants A's attempt, but its reply takes two leases: by then the lease has run
    // out, and B (on the same server, without delay) may hold the lock. A must not come back
    // with a guard for that acquisition; it waits and takes the lock anew.
    let lease = Duration::from_millis(400);
    let slow = slow_net(SlowNet::default());
    slow.late_once_ms
        .store((lease * 2).as_millis() as u64, Ordering::SeqCst);
    let a = registry(slow.clone(), lease, true);
    let b = LockRegistry::from_backend(
        slow.inner.clone(),
        RegistryOptions::default().with_lease(lease),
    )
    .unwrap();
    let holders = Arc::new(AtomicU64::new(0));
    let section = |reg: LockRegistry, who: &'static str| {
        let holders = holders.clone();
        async move {
            let guard = reg.obtain("k").unwrap().lock().await.unwrap();
            assert!(
                guard.ensure_held().is_ok(),
                "{who} got a guard that was already lost"
            );
            assert_eq!(
                holders.fetch_add(1, Ordering::SeqCst),
                0,
                "{who} got a guard while the other held the lock"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            holders.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.unwrap();
        }
    };
    let first = tokio::spawn(section(a, "A"));
    // B starts once A's attempt has reached the server.
    let name = LockName::new("lock", "k").unwrap();
    while slow.inner.inspect(&name).await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = tokio::spawn(section(b, "B"));
    let both = async {
        first.await.unwrap();
        second.await.unwrap();
    };
    tokio::time::timeout(lease * 20, both)
        .await
        .expect("both sections end");
}
