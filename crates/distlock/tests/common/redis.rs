//! Helpers shared by the Redis test binaries.

/// Takes `lock` and releases it at once, so that its release is published.
pub async fn take_and_release(lock: distlock::Result<distlock::Lock>) {
    lock.unwrap().lock().await.unwrap().release().await.unwrap();
}
