//! In-process backend: locks exclude tasks of one process only. The default for tests and for
//! programs that run as a single instance.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{
    AcquireRequest, Attempt, Backend, Capabilities, LockInfo, LockName, ReleaseSignals,
    ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::Result;

#[derive(Debug)]
struct Entry {
    token: Option<Token>,
    expires: Instant,
    fence: u64,
}

/// Locks in this process's memory, with the same lease and fencing behaviour as the remote
/// backends. Build it with [`MemoryBackend::new`] or the URL `memory://`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use distlock::{LockRegistry, backends::memory::MemoryBackend};
/// let registry = LockRegistry::new(MemoryBackend::new());
/// let guard = registry.obtain("job:nightly")?.lock().await?;
/// assert!(guard.is_held());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct MemoryBackend {
    locks: Mutex<HashMap<LockName, Entry>>,
    signals: ReleaseSignals,
}

impl MemoryBackend {
    /// An empty in-memory lock table.
    pub fn new() -> Self {
        Self::default()
    }

    fn channel(name: &LockName) -> String {
        format!("{}:{}", name.prefix(), name.key())
    }
}

/// Resets the lease of an entry held with `token` and not expired at `now`.
fn extend_entry(entry: Option<&mut Entry>, token: Token, lease: Duration, now: Instant) -> bool {
    match entry {
        Some(e) if e.token == Some(token) && e.expires > now => {
            e.expires = now + lease;
            true
        }
        _ => false,
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("memory")
            .notifies_release(true)
            .cross_process(false)
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let now = Instant::now();
        let mut map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(name.clone()).or_insert(Entry {
            token: None,
            expires: now,
            fence: 0,
        });
        // Held with this very token: an earlier attempt of the same acquisition got it.
        let mine = entry.token == Some(token);
        if entry.token.is_some() && entry.expires > now && !mine {
            return Ok(Attempt::Busy {
                retry_after: Some(entry.expires - now),
            });
        }
        entry.token = Some(token);
        entry.expires = now + lease;
        entry.fence += 1;
        Ok(Attempt::Acquired { fence: entry.fence })
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let now = Instant::now();
        let was_held = {
            let mut map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            match map.get_mut(name) {
                Some(e) if e.token == Some(token) && e.expires > now => {
                    e.token = None;
                    true
                }
                _ => false,
            }
        };
        if was_held {
            self.signals.fire(&Self::channel(name));
        }
        Ok(Released {
            was_held,
            contended: false,
        })
    }

    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let now = Instant::now();
        let mut map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        Ok(extend_entry(map.get_mut(name), token, lease, now))
    }

    /// One pass over the table under one lock, rather than a future per renewal.
    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        let now = Instant::now();
        let mut map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        batch
            .iter()
            .map(|r| Ok(extend_entry(map.get_mut(&r.name), r.token, r.lease, now)))
            .collect()
    }

    async fn subscribe(&self, name: &LockName, _waiter: Token) -> Result<ReleaseSubscription> {
        Ok(self.signals.subscribe(&Self::channel(name)).0)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        let map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        Ok(map.get(name).and_then(|e| {
            (e.token.is_some() && e.expires > now).then(|| LockInfo {
                fence: Some(e.fence),
                remaining: Some(e.expires - now),
            })
        }))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let now = Instant::now();
        let mut map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        let existed = map
            .get_mut(name)
            .and_then(|e| e.token.take().filter(|_| e.expires > now))
            .is_some();
        drop(map);
        self.signals.fire(&Self::channel(name));
        Ok(existed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::AcquireMode;

    /// A backend that implements only the required methods.
    #[derive(Debug)]
    struct Minimal;

    #[async_trait]
    impl Backend for Minimal {
        fn capabilities(&self) -> Capabilities {
            Capabilities::new("minimal")
        }
        async fn acquire(&self, _: &AcquireRequest) -> Result<Attempt> {
            Ok(Attempt::Busy { retry_after: None })
        }
        async fn release(&self, _: &LockName, _: Token) -> Result<Released> {
            Ok(Released::default())
        }
        async fn extend(&self, _: &LockName, _: Token, _: Duration) -> Result<bool> {
            Ok(false)
        }
        async fn inspect(&self, _: &LockName) -> Result<Option<LockInfo>> {
            Ok(None)
        }
    }

    #[tokio::test]
    async fn force_release_frees_the_lock_and_keeps_the_fence() {
        let b = MemoryBackend::new();
        let n = LockName::new("lock", "k").unwrap();
        let lease = Duration::from_secs(30);
        let first = b
            .acquire(&AcquireRequest::new(n.clone(), Token::random(), lease))
            .await;
        assert_eq!(first.unwrap(), Attempt::Acquired { fence: 1 });
        let mut sub = b.subscribe(&n, Token::random()).await.unwrap();
        assert!(b.force_release(&n).await.unwrap());
        tokio::time::timeout(Duration::from_secs(1), sub.released())
            .await
            .expect("waiters are woken");
        assert!(
            !b.force_release(&n).await.unwrap(),
            "nothing left to remove"
        );
        let queued = AcquireRequest::new(n.clone(), Token::random(), lease);
        let next = b.acquire(&queued.with_mode(AcquireMode::Queue)).await;
        assert_eq!(next.unwrap(), Attempt::Acquired { fence: 2 });
    }

    #[tokio::test]
    async fn extend_many_answers_each_renewal_in_order() {
        let b = MemoryBackend::new();
        let lease = Duration::from_secs(30);
        let held = LockName::new("lock", "held").unwrap();
        let token = Token::random();
        let attempt = b
            .acquire(&AcquireRequest::new(held.clone(), token, lease))
            .await;
        assert!(matches!(attempt, Ok(Attempt::Acquired { .. })));
        let renewal = |name: &LockName, token| Renewal {
            name: name.clone(),
            token,
            lease: Duration::from_secs(60),
        };
        let unknown = LockName::new("lock", "never-taken").unwrap();
        let results = b
            .extend_many(&[
                renewal(&unknown, token),
                renewal(&held, token),
                renewal(&held, Token::random()),
            ])
            .await;
        let results: Vec<bool> = results.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(results, [false, true, false]);
        let remaining = b.inspect(&held).await.unwrap().unwrap().remaining.unwrap();
        assert!(
            remaining > lease,
            "the new lease applies: {remaining:?} left"
        );
    }

    #[tokio::test]
    async fn force_release_is_unsupported_by_default() {
        let n = LockName::new("lock", "k").unwrap();
        match Minimal.force_release(&n).await {
            Err(crate::Error::Unsupported { backend, .. }) => assert_eq!(backend, "minimal"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
