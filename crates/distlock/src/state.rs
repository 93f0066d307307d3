//! The state one registry shares between its handles and guards ([`Inner`]: the backend, the
//! options, the renewal task, the background work and the handle cache of `cache.rs`), the
//! per-key state ([`Slot`]: the local lock and the remote hold that passes between local
//! guards), and how a hold is given up: to the next local waiter, or released on the server.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::backend::{Backend, LockName, Token};
use crate::background::Background;
use crate::error::{Error, Result};
use crate::options::RegistryOptions;
use crate::renewal::{Hold, Renewer};

mod cache;

use self::cache::{CachedSlot, Slots};

/// What all clones of a registry, and its handles and guards, share.
pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) opts: RegistryOptions,
    pub(crate) prefix: Arc<str>,
    slots: Mutex<Slots>,
    pub(crate) renewer: Arc<Renewer>,
    pub(crate) background: Background,
    epoch: Instant,
}

/// Per-key state shared by all handles and guards of one key in one registry.
pub(crate) struct Slot {
    pub(crate) name: LockName,
    pub(crate) last_used_ms: AtomicU64,
    /// Made by the first acquisition (or use of the blocking facade): most cached handles are
    /// only obtained, and then cost no local lock.
    local: OnceLock<Box<LocalLock>>,
}

/// The local lock of a key and what goes with it.
pub(crate) struct LocalLock {
    pub(crate) state: Arc<tokio::sync::Mutex<SlotState>>,
    pub(crate) waiters: AtomicUsize,
    /// The holds threads took through the blocking facade, which is reentrant per thread: at
    /// most one for an exclusive kind, one per thread for the shared ones. Their type is the
    /// facade's own (it holds guards, which are made above this state); made on first use.
    pub(crate) thread_holds: OnceLock<Box<dyn Any + Send + Sync>>,
    /// Read locks only: the remote read hold that local readers join (see `ReadGroup`).
    pub(crate) readers: Mutex<Option<Arc<ReadGroup>>>,
}

/// A remote read hold shared by the local readers of one registry: a reader that finds one
/// worth joining takes part in it with no round trip; the last one to leave releases it. It
/// takes at most `max_local_handoffs` joiners, so that a stream of local readers cannot keep
/// it (and a writer waiting for the key elsewhere) going for ever.
pub(crate) struct ReadGroup {
    pub(crate) hold: Arc<Hold>,
    /// The local guards taking part; 0 once the last one left (nobody may join then).
    readers: Mutex<u32>,
}

impl ReadGroup {
    pub(crate) fn new(hold: Arc<Hold>) -> Self {
        ReadGroup {
            hold,
            readers: Mutex::new(1),
        }
    }

    fn readers(&self) -> std::sync::MutexGuard<'_, u32> {
        self.readers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins when the group still has readers, enough lease left and joins to spare; returns
    /// the joiner's local sequence number.
    pub(crate) fn join(&self, max_joins: u32) -> Option<u32> {
        let mut n = self.readers();
        if *n == 0
            || self.hold.local_seq.load(Ordering::Acquire) >= max_joins
            || !worth_handing_off(&self.hold)
        {
            return None;
        }
        *n += 1;
        Some(self.hold.local_seq.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// Leaves; true for the last reader, who must release the hold.
    pub(crate) fn leave(&self) -> bool {
        let mut n = self.readers();
        *n = n.saturating_sub(1);
        *n == 0
    }
}

/// What the local lock protects: the remote hold that may pass between local guards.
#[derive(Default)]
pub(crate) struct SlotState {
    pub(crate) hold: Option<Arc<Hold>>,
    /// Until then this registry lets remote waiters go first (see `contended_release_grace`).
    pub(crate) yield_until: Option<Instant>,
    /// The last acquisition had to wait for another holder.
    pub(crate) contended: bool,
}

impl Inner {
    /// The state of a new registry over `backend` with validated `options`.
    pub(crate) fn new(backend: Arc<dyn Backend>, options: RegistryOptions) -> Self {
        let renewer = Arc::new(Renewer::new(backend.clone(), options.renew));
        let evict_at = options.max_cached_locks;
        Inner {
            prefix: Arc::from(options.prefix.as_str()),
            backend,
            opts: options,
            slots: Mutex::new(Slots {
                by_key: HashSet::new(),
                others: HashMap::new(),
                evict_at,
            }),
            renewer,
            background: Background::default(),
            epoch: Instant::now(),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn max_poll(&self) -> Duration {
        self.opts.max_poll_interval.unwrap_or_else(|| {
            if self.backend.capabilities().notifies_release {
                Duration::from_millis(500)
            } else {
                Duration::from_millis(50)
            }
        })
    }

    /// The cached slot of the mutex `key`, made (and the cache bounded) when there is none.
    /// Fails only on an invalid key.
    pub(crate) fn slot_of_key(&self, key: &str) -> Result<Arc<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match slots.by_key.get(key) {
            Some(s) => s.0.clone(),
            None => {
                let name = LockName::new(self.prefix.clone(), key)?;
                if slots.len() >= slots.evict_at {
                    slots.evict_idle(self.opts.max_cached_locks);
                }
                let slot = Slot::new(name);
                slots.by_key.insert(CachedSlot(slot.clone()));
                slot
            }
        };
        drop(slots);
        Ok(slot)
    }

    /// The cached slot of a name that is not a plain mutex.
    pub(crate) fn slot_of_name(&self, name: LockName) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let at = (name.clone(), name.is_election());
        let slot = match slots.others.get(&at) {
            Some(s) => s.clone(),
            None => {
                if slots.len() >= slots.evict_at {
                    slots.evict_idle(self.opts.max_cached_locks);
                }
                let slot = Slot::new(name);
                slots.others.insert(at, slot.clone());
                slot
            }
        };
        drop(slots);
        slot
    }

    /// Ends a guard's ownership of `slot`. Returns the local lock and the remote hold when the
    /// hold must be released remotely, `None` when it passed to a local waiter.
    pub(crate) fn give_up(
        &self,
        slot: &Arc<Slot>,
        mut local: OwnedMutexGuard<SlotState>,
        hold: &Arc<Hold>,
    ) -> Option<OwnedMutexGuard<SlotState>> {
        let pass_on = slot.waiters().load(Ordering::SeqCst) > 0
            && hold.local_seq.load(Ordering::Acquire) < self.opts.max_local_handoffs()
            && worth_handing_off(hold);
        if pass_on {
            drop(local);
            // The waiter we counted may have left meanwhile; then the hold is nobody's.
            slot.release_orphaned_hold(self);
            return None;
        }
        local.hold = None;
        self.renewer.deregister(hold);
        Some(local)
    }

    /// Releases `hold` on the server, then lets the next local waiter in (when the hold came
    /// with the local lock). Returns whether it was still held.
    pub(crate) async fn release_hold(
        &self,
        local: Option<OwnedMutexGuard<SlotState>>,
        hold: &Hold,
    ) -> Result<bool> {
        let released = match self.backend.release(&hold.name, hold.token).await {
            Ok(r) => r,
            Err(e @ Error::Unavailable { .. }) => {
                // The caller hears of the failure, and the release goes on in the background
                // until the server answers or the lease ends anyway.
                self.release_retrying(hold.name.clone(), hold.token, hold.valid_until());
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if let Some(mut local) = local {
            if released.contended {
                let grace = self.opts.contended_release_grace();
                if !grace.is_zero() {
                    local.yield_until = Some(Instant::now() + grace);
                }
            }
            drop(local);
        }
        Ok(released.was_held)
    }

    /// Gives a remote hold back in the background (cancelled acquisitions, stale holds),
    /// trying again after a transient failure for up to the registry's lease.
    pub(crate) fn release_in_background(&self, name: LockName, token: Token) {
        let until = Instant::now()
            .checked_add(self.opts.lease())
            .unwrap_or_else(Instant::now);
        self.release_retrying(name, token, until);
    }

    /// Gives a remote hold back in the background, trying again after each transient failure
    /// ([`Error::Unavailable`]: a server restarting, a connection reset) until `until`, when
    /// the server lets the lease go by itself. Without the retries, a release that met a
    /// server's restart would leave the key held by nobody for the rest of the lease. A
    /// release is owner-checked, so one that arrives late frees nothing of anybody else's.
    pub(crate) fn release_retrying(&self, name: LockName, token: Token, until: Instant) {
        let backend = self.backend.clone();
        self.background.spawn(async move {
            let mut pause = RETRY_PAUSE;
            loop {
                match backend.release(&name, token).await {
                    Ok(_) => return,
                    Err(e @ Error::Unavailable { .. }) if Instant::now() + pause < until => {
                        tracing::debug!(lock = ?name, error = %e, "release failed; trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(RETRY_PAUSE_MAX);
                    }
                    Err(e) => {
                        tracing::debug!(lock = ?name, error = %e, "background release failed; the lease will expire");
                        return;
                    }
                }
            }
        });
    }
}

/// The first pause before a failed background release is tried again; it doubles up to
/// [`RETRY_PAUSE_MAX`].
const RETRY_PAUSE: Duration = Duration::from_millis(50);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);

impl Drop for Inner {
    fn drop(&mut self) {
        // Never waits here: a drop may run on a runtime thread, and the tasks need no registry.
        let pending = self.background.pending();
        if pending > 0 {
            tracing::debug!(
                pending,
                "registry dropped with background releases still running; LockRegistry::flush waits for them"
            );
        }
    }
}

impl Slot {
    fn new(name: LockName) -> Arc<Self> {
        Arc::new(Slot {
            name,
            last_used_ms: AtomicU64::new(0),
            local: OnceLock::new(),
        })
    }

    /// The local lock, made on first use.
    pub(crate) fn local(&self) -> &LocalLock {
        self.local.get_or_init(|| {
            Box::new(LocalLock {
                state: Arc::new(tokio::sync::Mutex::new(SlotState::default())),
                waiters: AtomicUsize::new(0),
                thread_holds: OnceLock::new(),
                readers: Mutex::new(None),
            })
        })
    }

    /// The remote read hold local readers may join (read locks only).
    pub(crate) fn readers(&self) -> std::sync::MutexGuard<'_, Option<Arc<ReadGroup>>> {
        self.local()
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// How many local tasks wait for the local lock.
    pub(crate) fn waiters(&self) -> &AtomicUsize {
        &self.local().waiters
    }

    /// Only the cache refers to it and nobody holds or waits for it.
    fn is_idle(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1
            && self.local.get().is_none_or(|l| {
                l.waiters.load(Ordering::SeqCst) == 0
                    && l.state
                        .try_lock()
                        .map(|s| s.hold.is_none())
                        .unwrap_or(false)
                    && l.readers.lock().map(|r| r.is_none()).unwrap_or(false)
            })
    }

    /// Releases a remote hold left for a local waiter who then gave up. Called by whoever saw
    /// the last waiter leave; the double check (waiter count, then the local lock) means that
    /// of the leaving waiter and the handing-off guard at least one finds it.
    pub(crate) fn release_orphaned_hold(self: &Arc<Self>, registry: &Inner) {
        let local = self.local();
        if local.waiters.load(Ordering::SeqCst) != 0 {
            return;
        }
        if let Ok(mut state) = local.state.clone().try_lock_owned() {
            if let Some(hold) = state.hold.take() {
                registry.renewer.deregister(&hold);
                registry.release_in_background(hold.name.clone(), hold.token);
            }
        }
    }
}

// The local handoff protocol: a remote hold passes from a local guard to the next local waiter
// (`Inner::give_up`), which takes it over (`Lock::acquire_exclusive`) while it is worth it; a
// hold left for a waiter who then gave up is released by whoever sees the last waiter leave
// (`Slot::release_orphaned_hold`).

/// Whether enough of a hold's lease is left to pass it to a local waiter: a renewal is due
/// at a third of the lease, so below that the next holder would start on a hold about to be
/// renewed or lost.
pub(crate) fn worth_handing_off(hold: &Hold) -> bool {
    hold.is_held() && hold.remaining() > hold.lease() / 3
}
