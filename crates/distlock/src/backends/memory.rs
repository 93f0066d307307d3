//! In-process backend: locks exclude tasks of one process only. The default for tests and for
//! programs that run as a single instance.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{
    AcquireRequest, Attempt, Backend, Capabilities, ListedLock, LockInfo, LockKind, LockName,
    Owner, ReleaseSignals, ReleaseSubscription, Released, Renewal, Token, UNKNOWN_OWNER,
};
use crate::error::{Error, Result};

/// How long a waiting writer keeps new readers out without attempting again. The registry
/// attempts at least every `max_poll_interval` (500 ms by default here) and gives its place
/// back when it stops waiting, so this only bounds a place nobody gave back.
const WRITER_PLACE: Duration = Duration::from_secs(5);

/// One key: its holders (of one kind, or readers, or permits of one semaphore), the writers
/// waiting for it, and the fence counter every kind shares.
#[derive(Debug, Default)]
struct Entry {
    holders: ByToken<Holder>,
    writers_waiting: ByToken<Instant>,
    fence: u64,
}

/// Values by token, in a vector grown one by one from empty (no allocation). A key has one
/// holder as a rule (a mutex or a writer), and a hash table per key costs several times that:
/// with two of them per key, 100,000 held locks took 1,175 bytes each, with vectors 955
/// (`bench/scale`, `memory://`). Lookups scan, which a semaphore of thousands of permits
/// would feel; the usual handful of holders does not.
#[derive(Debug)]
struct ByToken<V>(Vec<(Token, V)>);

impl<V> Default for ByToken<V> {
    fn default() -> Self {
        ByToken(Vec::new())
    }
}

impl<V> ByToken<V> {
    fn position(&self, token: &Token) -> Option<usize> {
        self.0.iter().position(|(t, _)| t == token)
    }

    fn get_mut(&mut self, token: &Token) -> Option<&mut V> {
        let i = self.position(token)?;
        Some(&mut self.0[i].1)
    }

    fn contains_key(&self, token: &Token) -> bool {
        self.position(token).is_some()
    }

    fn insert(&mut self, token: Token, value: V) {
        if let Some(v) = self.get_mut(&token) {
            *v = value;
            return;
        }
        if self.0.len() == self.0.capacity() {
            self.0.reserve_exact(self.0.len().max(1));
        }
        self.0.push((token, value));
    }

    fn remove(&mut self, token: &Token) -> Option<V> {
        let i = self.position(token)?;
        let (_, v) = self.0.swap_remove(i);
        self.shrink_if_empty();
        Some(v)
    }

    fn retain(&mut self, mut keep: impl FnMut(&Token, &mut V) -> bool) {
        self.0.retain_mut(|(t, v)| keep(t, v));
        self.shrink_if_empty();
    }

    /// An entry stays for its fence counter after its last holder left: it keeps no
    /// allocation for holders it no longer has.
    fn shrink_if_empty(&mut self) {
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
    }

    fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn clear(&mut self) {
        self.0 = Vec::new();
    }
}

#[derive(Debug, Clone)]
struct Holder {
    kind: LockKind,
    expires: Instant,
    /// Shared with the registry's own `Owner` (a reference count, no copy of the text).
    owner: Option<Owner>,
}

impl Entry {
    /// Forgets holders whose lease ran out and writers that stopped waiting.
    fn prune(&mut self, now: Instant) {
        self.holders.retain(|_, h| h.expires > now);
        self.writers_waiting.retain(|_, until| *until > now);
    }

    fn info(&self, now: Instant) -> Option<LockInfo> {
        let first = self.holders.values().next()?;
        let remaining = self.holders.values().map(|h| h.expires - now).max();
        Some(
            LockInfo::new(Some(self.fence), remaining)
                .with_kind(first.kind)
                .with_holders(self.holders.len() as u32)
                .with_waiters(self.writers_waiting.len() as u32)
                .with_owners(self.holders.values().map(|h| {
                    h.owner
                        .as_ref()
                        .map_or_else(|| UNKNOWN_OWNER.to_string(), |o| o.to_string())
                })),
        )
    }
}

/// Locks in this process's memory, with the same lease and fencing behaviour as the remote
/// backends, for every [`LockKind`]. Build it with [`MemoryBackend::new`] or the URL
/// `memory://`.
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
    /// Keyed by the mutex name of each key: all kinds of a key share one entry.
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

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<LockName, Entry>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The entry of `name`'s key, whatever the kind of `name`.
fn entry_key(name: &LockName) -> LockName {
    name.clone().with_kind(LockKind::Mutex)
}

/// Resets the lease of a holder with `token` whose lease has not run out at `now`.
fn extend_entry(entry: Option<&mut Entry>, token: Token, lease: Duration, now: Instant) -> bool {
    match entry.and_then(|e| e.holders.get_mut(&token)) {
        Some(h) if h.expires > now => {
            h.expires = now + lease;
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
            .all_kinds()
            .owners(true)
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let kind = name.kind();
        let now = Instant::now();
        let mut map = self.table();
        let entry = map.entry(entry_key(name)).or_default();
        entry.prune(now);
        // Held with this very token: an earlier attempt of the same acquisition got it.
        let mine = entry.holders.contains_key(&token);
        if !mine {
            if let LockKind::Semaphore { permits } = kind {
                let other = entry.holders.values().find_map(|h| match h.kind {
                    LockKind::Semaphore { permits: p } if p != permits => Some(p),
                    _ => None,
                });
                if let Some(p) = other {
                    return Err(Error::config(format!(
                        "semaphore {} has holders with {p} permits; this one asks for {permits}",
                        crate::ShortKey(name.key())
                    )));
                }
            }
            let shares = entry.holders.values().all(|h| h.kind.shares_with(kind));
            let room = entry.holders.len() < kind.max_holders() as usize;
            // A waiting writer keeps new readers out, so that readers cannot starve it.
            let writer_waits = kind == LockKind::Read && !entry.writers_waiting.is_empty();
            if !(shares && room) || writer_waits {
                if kind.is_exclusive() && request.queued() {
                    entry.writers_waiting.insert(token, now + WRITER_PLACE);
                }
                let retry_after = entry.holders.values().map(|h| h.expires - now).min();
                return Ok(Attempt::Busy {
                    retry_after,
                    ahead: None,
                });
            }
        }
        entry.writers_waiting.remove(&token);
        entry.holders.insert(
            token,
            Holder {
                kind,
                expires: now + lease,
                owner: request.owner.clone(),
            },
        );
        entry.fence += 1;
        Ok(Attempt::Acquired { fence: entry.fence })
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let now = Instant::now();
        let was_held = {
            let mut map = self.table();
            match map.get_mut(&entry_key(name)) {
                // The entry stays: its fence counter must keep counting.
                Some(e) => e.holders.remove(&token).is_some_and(|h| h.expires > now),
                None => false,
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
        let mut map = self.table();
        Ok(extend_entry(
            map.get_mut(&entry_key(name)),
            token,
            lease,
            now,
        ))
    }

    /// One pass over the table under one lock, rather than a future per renewal.
    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        let now = Instant::now();
        let mut map = self.table();
        batch
            .iter()
            .map(|r| {
                Ok(extend_entry(
                    map.get_mut(&entry_key(&r.name)),
                    r.token,
                    r.lease,
                    now,
                ))
            })
            .collect()
    }

    async fn subscribe(&self, name: &LockName, _waiter: Token) -> Result<ReleaseSubscription> {
        Ok(self.signals.subscribe(&Self::channel(name)).0)
    }

    /// Gives up a waiting writer's place, and lets the readers it kept out try again.
    async fn leave_queue(&self, name: &LockName, token: Token) -> Result<()> {
        let left = self
            .table()
            .get_mut(&entry_key(name))
            .is_some_and(|e| e.writers_waiting.remove(&token).is_some());
        if left {
            self.signals.fire(&Self::channel(name));
        }
        Ok(())
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        let mut map = self.table();
        Ok(map.get_mut(&entry_key(name)).and_then(|e| {
            e.prune(now);
            e.info(now)
        }))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let now = Instant::now();
        let mut map = self.table();
        let existed = map.get_mut(&entry_key(name)).is_some_and(|e| {
            e.prune(now);
            let any = !e.holders.is_empty();
            e.holders.clear();
            any
        });
        drop(map);
        self.signals.fire(&Self::channel(name));
        Ok(existed)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let now = Instant::now();
        let mut map = self.table();
        Ok(map
            .iter_mut()
            .filter(|(name, _)| name.prefix() == prefix)
            .filter_map(|(name, e)| {
                e.prune(now);
                e.info(now).map(|info| ListedLock {
                    key: name.key().to_owned(),
                    info,
                })
            })
            .collect())
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
            Ok(Attempt::BUSY)
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
