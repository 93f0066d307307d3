//! The handle cache of a registry: slots found by key, the eviction of idle handles when the
//! bound is reached, and their expiry by age.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{Inner, Slot};
use crate::backend::{LockKind, LockName};

/// The handle cache: slots found by their key. A registry may cache a million handles, so a
/// mutex entry is one pointer, and the key it is found by is the slot name's own allocation.
/// The other kinds (read and write sides of read-write locks, semaphores) and elections are
/// found by their whole name and whether it is an election's (which `LockName` does not
/// compare).
pub(super) struct Slots {
    pub(super) by_key: HashSet<CachedSlot>,
    pub(super) others: HashMap<(LockName, bool), Arc<Slot>>,
    /// The size at which `obtain` next looks for idle handles to evict (see `evict_idle`).
    pub(super) evict_at: usize,
}

pub(super) struct CachedSlot(pub(super) Arc<Slot>);

impl Borrow<str> for CachedSlot {
    fn borrow(&self) -> &str {
        self.0.name.key()
    }
}

// Hashed and compared as the key alone, as `Borrow<str>` requires.
impl Hash for CachedSlot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.key().hash(state)
    }
}

impl PartialEq for CachedSlot {
    fn eq(&self, other: &Self) -> bool {
        self.0.name.key() == other.0.name.key()
    }
}

impl Eq for CachedSlot {}

impl Inner {
    /// Drops cached handles that are idle (not held, not waited for, not referenced outside the
    /// registry) and were last obtained or locked longer than `age` ago. Returns how many.
    pub(crate) fn expire_unused_older_than(&self, age: Duration) -> usize {
        let now = self.now_ms();
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let before = slots.len();
        let expired = |s: &Arc<Slot>| {
            s.is_idle() && now.saturating_sub(s.last_used_ms.load(Ordering::Relaxed)) >= age_ms
        };
        slots.by_key.retain(|CachedSlot(s)| !expired(s));
        slots.others.retain(|_, s| !expired(s));
        let removed = before - slots.len();
        slots.plan_next_eviction(self.opts.max_cached_locks);
        removed
    }

    /// How many lock handles are cached.
    pub(crate) fn cached_locks(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Slots {
    pub(super) fn len(&self) -> usize {
        self.by_key.len() + self.others.len()
    }

    /// Drops the oldest idle handles until a tenth of the bound is free again, as far as there
    /// are idle ones.
    pub(super) fn evict_idle(&mut self, bound: usize) {
        let target = bound - bound / 10;
        let mut idle: Vec<(u64, Arc<Slot>)> = self
            .by_key
            .iter()
            .map(|CachedSlot(s)| s)
            .chain(self.others.values())
            .filter(|s| s.is_idle())
            .map(|s| (s.last_used_ms.load(Ordering::Relaxed), s.clone()))
            .collect();
        idle.sort_unstable_by_key(|(used, _)| *used);
        let excess = self.len().saturating_sub(target);
        for (_, s) in idle.into_iter().take(excess) {
            if s.name.kind() == LockKind::Mutex && !s.name.is_election() {
                self.by_key.remove(s.name.key());
            } else {
                self.others.remove(&(s.name.clone(), s.name.is_election()));
            }
        }
        self.plan_next_eviction(bound);
    }

    /// When every cached handle is referenced, a pass frees nothing; looking again at every
    /// insertion would make `obtain` linear in the cache. The next pass waits until the cache
    /// grew by a tenth of the bound or of itself, whichever is more; after a pass that freed
    /// enough, that is the bound again.
    fn plan_next_eviction(&mut self, bound: usize) {
        let len = self.len();
        self.evict_at = bound.max(len + (bound / 10).max(len / 10).max(1));
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use super::*;
    use crate::backends::memory::MemoryBackend;
    use crate::{Lock, LockRegistry, RegistryOptions};

    fn registry(bound: usize) -> LockRegistry {
        let opts = RegistryOptions::default().with_max_cached_locks(bound);
        LockRegistry::with_options(MemoryBackend::new(), opts).unwrap()
    }

    #[test]
    fn referenced_handles_stay_cached_and_idle_ones_are_evicted_afterwards() {
        let reg = registry(10);
        let kept: Vec<Lock> = (0..100)
            .map(|i| reg.obtain(&format!("kept{i}")).unwrap())
            .collect();
        assert_eq!(
            reg.cached_locks(),
            100,
            "referenced handles are never evicted"
        );
        let evict_at = reg.inner.slots.lock().unwrap().evict_at;
        assert!(
            evict_at > 100,
            "a pass that freed nothing is not repeated at the next obtain ({evict_at})"
        );
        drop(kept);
        for i in 0..evict_at {
            drop(reg.obtain(&format!("new{i}")).unwrap());
        }
        assert!(
            reg.cached_locks() <= 10,
            "once idle they are evicted: {} cached",
            reg.cached_locks()
        );
    }

    #[test]
    fn a_handle_only_obtained_has_no_local_lock_until_it_is_locked() {
        let reg = registry(10);
        let lock = reg.obtain("k").unwrap();
        assert!(lock.slot.local.get().is_none());
        assert_eq!(reg.obtain("k").unwrap().key(), "k", "found by its key");
        assert_eq!(reg.cached_locks(), 1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let guard = lock.lock().await.unwrap();
            assert!(lock.slot.local.get().is_some());
            guard.release().await.unwrap();
        });
        drop(lock);
        assert_eq!(reg.expire_unused_older_than(Duration::ZERO), 1);
    }
}
