//! Holds taken the short way, where the chain of calls that takes them would hide what a test
//! checks.

use distlock::{LockGuard, LockRegistry};

/// A read hold of `key`'s read-write lock, waited for.
///
/// # Panics
/// When the name is invalid or the hold cannot be taken.
pub async fn read(reg: &LockRegistry, key: &str) -> LockGuard {
    reg.read_write(key).unwrap().read().lock().await.unwrap()
}

/// Takes `key`'s mutex without waiting: it must be free (`why` says why, in the failure).
///
/// # Panics
/// When the name is invalid or the mutex is not free.
pub async fn take_free(reg: &LockRegistry, key: &str, why: &str) -> LockGuard {
    reg.obtain(key).unwrap().try_lock().await.expect(why)
}

/// [`take_free`], and gives the mutex back at once.
///
/// # Panics
/// As [`take_free`], or when the release fails.
pub async fn free(reg: &LockRegistry, key: &str, why: &str) {
    give_back(reg.obtain(key).unwrap().try_lock().await, why).await;
}

/// Gives back the guard of an attempt that must have succeeded (`why` says why, in the
/// failure).
///
/// # Panics
/// When the attempt failed, or the release fails.
pub async fn give_back(attempt: distlock::Result<LockGuard>, why: &str) {
    attempt.expect(why).release().await.unwrap();
}

/// After a leader election under holds: each pair is a hold taken before it and the task of
/// another client waiting for the same key. A hold the election left held kept the other out,
/// and is given back; then the other gets the key within `wait`, with a higher fence.
///
/// # Panics
/// When two held at once, a kept hold cannot be given back, or the other does not get the key
/// in time.
pub async fn handed_on_after_an_election(
    pairs: impl IntoIterator<
        Item = (
            std::sync::Arc<LockGuard>,
            tokio::task::JoinHandle<LockGuard>,
        ),
    >,
    wait: std::time::Duration,
) {
    for (held, other) in pairs {
        let old = held.fence();
        if held.is_held() {
            assert!(
                !other.is_finished(),
                "{:?}: two holders at once",
                held.kind()
            );
            let held = std::sync::Arc::try_unwrap(held).expect("only guard");
            held.release()
                .await
                .expect("the holder kept its hold through the election");
        }
        let mine = tokio::time::timeout(wait, other)
            .await
            .expect("the key works again after the election")
            .unwrap();
        assert!(mine.fence() > old);
        mine.release().await.unwrap();
    }
}
