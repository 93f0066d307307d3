//! [`MultiLock`] and [`MultiGuard`]: several locks held together, all or nothing, taken in one
//! global order so that two multi-key holders can never deadlock.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lock::{Lock, Wait};

/// Several locks held together: [`lock`](Self::lock) returns one [`MultiGuard`] once every
/// lock is held, or nothing at all. From [`LockRegistry::multi`](crate::LockRegistry::multi)
/// (the mutexes of several keys) or [`MultiLock::new`] (any handles, of any kind: the read
/// sides of several read-write locks, say).
///
/// The locks are taken one after another in the order of their prefix and key, whatever order
/// they were given in, so two multi-key holders whose keys overlap always meet at the first
/// key they share, and never hold one key each while waiting for the other's. An acquisition
/// that fails partway (busy, timed out, an error, cancelled) gives back what it took.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use distlock::{LockRegistry, backends::memory::MemoryBackend};
/// let registry = LockRegistry::new(MemoryBackend::new());
/// let transfer = registry.multi(&["account:17", "account:4"])?;
/// let guard = transfer.lock().await?;
/// assert!(guard.fence("account:4").is_some());
/// assert!(registry.obtain("account:17")?.try_lock().await.is_err());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// In acquisition order.
    locks: Vec<Lock>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.locks).finish()
    }
}

impl MultiLock {
    /// A multi-key lock over `locks`. Fails with [`Error::InvalidConfig`] for an empty list,
    /// and with [`Error::InvalidKey`] when a key appears twice (of any kind: a multi-key
    /// holder of two kinds of one key would wait for itself).
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> Result<MultiLock> {
        let mut locks: Vec<Lock> = locks.into_iter().collect();
        if locks.is_empty() {
            return Err(Error::config("a multi-key lock needs at least one key"));
        }
        locks.sort_by(|a, b| order(a).cmp(&order(b)));
        if let Some(pair) = locks.windows(2).find(|w| order(&w[0]) == order(&w[1])) {
            return Err(Error::InvalidKey(format!(
                "the key {} appears twice in a multi-key lock",
                crate::ShortKey(pair[0].key())
            )));
        }
        Ok(MultiLock { locks })
    }

    /// The locks, in the order they are taken.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// The same locks with another lease for the acquisitions made through the returned
    /// handle (see [`Lock::with_lease`]).
    pub fn with_lease(&self, lease: Duration) -> Result<MultiLock> {
        Ok(MultiLock {
            locks: self
                .locks
                .iter()
                .map(|l| l.with_lease(lease))
                .collect::<Result<_>>()?,
        })
    }

    /// The same locks, their holds described as `owner` (see [`Lock::with_owner`]).
    pub fn with_owner(&self, owner: crate::Owner) -> MultiLock {
        MultiLock {
            locks: self
                .locks
                .iter()
                .map(|l| l.with_owner(owner.clone()))
                .collect(),
        }
    }

    /// Waits until every lock is held, however long that takes.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future gives back the locks taken so far (as dropping their
    /// guards does) and leaves nothing behind for the one being taken (as for
    /// [`Lock::lock`]).
    pub async fn lock(&self) -> Result<MultiGuard> {
        self.acquire(Wait::Forever).await
    }

    /// Takes every lock if each is free right now, else gives back what it took and fails
    /// with [`Error::NotAcquired`] naming the busy key.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<MultiGuard> {
        self.acquire(Wait::No).await
    }

    /// Waits at most `timeout` for all the locks together; else gives back what it took and
    /// fails with [`Error::NotAcquired`] naming the key that stayed busy.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_for(&self, timeout: Duration) -> Result<MultiGuard> {
        if timeout.is_zero() {
            return self.acquire(Wait::No).await;
        }
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.acquire(Wait::Until(deadline)).await,
            None => self.acquire(Wait::Forever).await,
        }
    }

    async fn acquire(&self, wait: Wait) -> Result<MultiGuard> {
        let started = Instant::now();
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            match lock.acquire(wait).await {
                Ok(g) => guards.push(g),
                Err(e) => {
                    // Give back what was taken before reporting; a release that fails leaves
                    // that lock to its lease (renewal has stopped).
                    futures_util::future::join_all(guards.into_iter().map(|g| g.release())).await;
                    return Err(match e {
                        Error::NotAcquired { key, .. } => Error::NotAcquired {
                            key,
                            waited: started.elapsed(),
                        },
                        e => e,
                    });
                }
            }
        }
        Ok(MultiGuard { guards })
    }
}

/// The prefix and key a lock is ordered by.
fn order(lock: &Lock) -> (&str, &str) {
    (lock.slot.name.prefix(), lock.key())
}

/// Every lock of a [`MultiLock`], held together: one fence per key, and lost as soon as any
/// of them is lost.
///
/// # Drop
/// Dropping it drops every guard (see [`LockGuard`]'s Drop): it never blocks, and the locks
/// are released in the background where a Tokio runtime runs.
#[must_use = "dropping the guard releases every lock (in the background) at once"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}

impl MultiGuard {
    /// The guard of each lock, in acquisition order (by prefix and key).
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The fence of `key`'s hold, if it is one of the keys.
    pub fn fence(&self, key: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.key() == key)
            .map(|g| g.fence())
    }

    /// Each key with the fence of its hold, in acquisition order.
    pub fn fences(&self) -> impl Iterator<Item = (&str, u64)> {
        self.guards.iter().map(|g| (g.key(), g.fence()))
    }

    /// True while every lock is held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(|g| g.is_held())
    }

    /// `Ok(())` while every lock is held, else [`Error::LockLost`] naming a lost key.
    pub fn ensure_held(&self) -> Result<()> {
        self.guards.iter().try_for_each(|g| g.ensure_held())
    }

    /// The shortest lease left among the locks (zero once one is lost).
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(|g| g.remaining())
            .min()
            .unwrap_or_default()
    }

    /// Completes when any of the locks is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let each: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            futures_util::future::select_all(each).await;
        }
    }

    /// Extends every lock to `lease` from now (see [`LockGuard::extend`]); the first error,
    /// if any.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`LockGuard::extend`].
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        futures_util::future::join_all(self.guards.iter().map(|g| g.extend(lease)))
            .await
            .into_iter()
            .collect()
    }

    /// Gives every lock back no earlier than `not_before` (see
    /// [`LockGuard::release_not_before`]); at once if one of them is lost meanwhile.
    ///
    /// # Cancel safety
    /// Dropped while it waits, the guards are dropped: the locks are released in the
    /// background at once.
    pub async fn release_not_before(self, not_before: tokio::time::Instant) -> Result<()> {
        let lost = self.lost();
        tokio::select! {
            () = lost => {}
            () = tokio::time::sleep_until(not_before) => {}
        }
        self.release().await
    }

    /// Gives every lock back. `Ok(())` when all were still held; else the first error
    /// ([`Error::LockLost`] for a lock lost meanwhile), after giving back the others.
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`] for each lock.
    pub async fn release(self) -> Result<()> {
        futures_util::future::join_all(self.guards.into_iter().map(|g| g.release()))
            .await
            .into_iter()
            .collect()
    }
}
