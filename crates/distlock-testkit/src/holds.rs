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

/// Takes `key`'s mutex without waiting and gives it back: it must be free (`why` says why, in
/// the failure).
///
/// # Panics
/// When the mutex is not free, or its release fails.
pub async fn take_free(reg: &LockRegistry, key: &str, why: &str) {
    reg.obtain(key)
        .unwrap()
        .try_lock()
        .await
        .expect(why)
        .release()
        .await
        .unwrap();
}
