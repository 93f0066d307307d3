//! The backend's in-memory state: the shared core ([`Shared`]), one [`Slot`] per token with its
//! [`Entry`] (what this instance knows about its key on the server), and the small helpers that
//! find, create and drop slots.

use crate::backend::{LockName, ReleaseSignal, Token};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use tokio::time::Instant;

use super::client::Client;
use super::options::{EtcdOptions, ORPHAN_GRACE, WAITER_IDLE};
use super::session::{KaCmd, Session};
use super::watch::{WatchHandle, WatchHub, WatchTarget};
use crate::backends::contenders::{Locked, Table};

pub(super) struct Shared {
    /// This value's own `Arc`, for the background tasks it starts.
    pub(super) me: Weak<Shared>,
    pub(super) client: Client,
    /// `etcd://host:port,...` without credentials, for messages.
    pub(super) target: String,
    pub(super) opts: EtcdOptions,
    pub(super) pool: Mutex<Vec<Arc<Session>>>,
    /// Serializes lease grants, so that concurrent first acquisitions share one session.
    pub(super) granting: tokio::sync::Mutex<()>,
    /// The slots, and when the reaper looks at which token's (see `renew.rs`).
    pub(super) slots: Table<Arc<Slot>>,
    pub(super) watches: WatchHub,
    /// Lock directories this instance released with other keys left in them (a waiter's, who
    /// holds now), and when: the next waiting try of the same lock expects it busy (see
    /// `AcquireRequest::waits`).
    pub(super) handed: Mutex<HashMap<String, Instant>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Revoke the sessions: every key of this instance goes at once instead of with the TTL.
        for s in self.pool.locked().iter() {
            let _ = s.cmds.send(KaCmd::Close);
        }
    }
}

/// Per-token state: one acquisition (waiting, holding, or being cleaned up).
pub(super) struct Slot {
    pub(super) signal: Arc<ReleaseSignal>,
    /// Alive while the registry holds the waiter's subscription.
    pub(super) sub: Mutex<Weak<()>>,
    /// The predecessor watch, while subscribed.
    pub(super) watch: Mutex<Option<WatchHandle>>,
    /// Shared so that an attempt can take it before its task starts (see `attempt`).
    pub(super) entry: Arc<tokio::sync::Mutex<Entry>>,
}

impl Slot {
    pub(super) fn new() -> Self {
        Slot {
            signal: Arc::new(ReleaseSignal::default()),
            sub: Mutex::new(Weak::new()),
            watch: Mutex::new(None),
            entry: Arc::new(tokio::sync::Mutex::new(Entry {
                touched: Some(Instant::now()),
                ..Entry::default()
            })),
        }
    }

    pub(super) fn subscribed(&self) -> bool {
        self.sub.locked().strong_count() > 0
    }

    pub(super) fn take_watch(&self) -> Option<WatchHandle> {
        self.watch.locked().take()
    }

    pub(super) fn watches(&self, target: &WatchTarget) -> bool {
        self.watch
            .locked()
            .as_ref()
            .is_some_and(|w| w.target == *target && !w.broken.load(Ordering::Acquire))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Phase {
    /// No key on the server (or not known yet, see `Entry::maybe_created`).
    #[default]
    New,
    /// The key is queued behind others.
    Queued,
    /// The key is the lowest: the lock is ours.
    Held,
    /// The key must be deleted; an earlier attempt failed.
    Zombie,
    /// Nothing left on the server.
    Done,
}

#[derive(Default)]
pub(super) struct Entry {
    pub(super) phase: Phase,
    pub(super) name: Option<LockName>,
    /// `<prefix>/<key>/`.
    pub(super) dir: String,
    /// `<dir><session lease id hex>` for a mutex, `<dir><kind>-<token>` for the other kinds
    /// (see `kinds.rs`).
    pub(super) key: String,
    /// What the key holds (the owner token; a permit's also its number of permits; an
    /// election candidate's: its bare description): releases and renewals compare it.
    pub(super) value: Vec<u8>,
    /// The session whose id names the key.
    pub(super) session: Option<Arc<Session>>,
    /// The session the key is attached to (another one after a longer extension).
    pub(super) attached: Option<Arc<Session>>,
    pub(super) create_rev: i64,
    /// A create request was sent without an answer: the key may exist.
    pub(super) maybe_created: bool,
    /// While `maybe_created`: the other name that create may have used (a waiter's, on this
    /// session), deleted with `key` and freed when the key is forgotten.
    pub(super) alt: Option<(String, Arc<Session>)>,
    /// While held: when the registry's lease ends without renewal.
    pub(super) deadline: Option<Instant>,
    /// Last call by the registry.
    pub(super) touched: Option<Instant>,
    /// What the last attempt found we wait for (the key created just before ours, for a mutex).
    pub(super) pred: Option<WatchTarget>,
    /// After the last look at the queue: the contenders ahead, and the slot's signal's
    /// generation (a later one means the predecessor's watch fired since).
    pub(super) seen: (Option<u32>, u64),
    /// The last attempt failed: the registry may not know that the key is queued.
    pub(super) failed_at: Option<Instant>,
}

/// What the reaper does with a slot (see [`Entry::fate`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Fate {
    /// Delete its key, then forget it.
    Delete,
    /// Forget it: nothing of it is on the server and nobody used it for a while.
    Forget,
    /// Look at it again then; never when `None` (a subscribed waiter's slot, planned again
    /// when the subscription is dropped; a zombie, whose deletion is retried on its own).
    Keep(Option<Instant>),
}

impl Shared {
    pub(super) fn slot(&self, token: Token) -> Option<Arc<Slot>> {
        self.slots.get(token)
    }

    pub(super) fn slot_for(&self, token: Token) -> Arc<Slot> {
        self.slots
            .get_or_insert_with(token, || Arc::new(Slot::new()))
    }

    pub(super) fn drop_slot(&self, token: Token, slot: &Arc<Slot>) {
        self.slots.forget_if(token, |s| Arc::ptr_eq(s, slot));
    }

    /// Makes sure the reaper looks at `token`'s slot at `at` at the latest.
    pub(super) fn reap_at(&self, token: Token, at: Instant) {
        self.slots.reap_by(token, at);
    }
}

impl Entry {
    /// The key is gone while queued or about to hold: the next round queues it again.
    pub(super) fn requeue(&mut self) {
        self.phase = Phase::New;
        self.create_rev = 0;
    }

    /// What the reaper does with this entry's slot at `now`: delete the key of a hold whose
    /// lease ended unrenewed, of an unsubscribed waiter idle for [`WAITER_IDLE`], of a failed
    /// attempt nobody came back to within [`ORPHAN_GRACE`] (the registry may have given up
    /// without knowing the key was queued), of a create whose answer was lost; forget an idle
    /// slot with nothing on the server.
    pub(super) fn fate(&self, subscribed: bool, now: Instant) -> Fate {
        let idle_at = self.touched.map(|t| t + WAITER_IDLE);
        let idle = idle_at.is_none_or(|t| t <= now);
        let orphan_at = self
            .failed_at
            .filter(|f| self.touched.is_none_or(|t| t <= *f))
            .map(|f| f + ORPHAN_GRACE);
        let unclaimed = (self.phase == Phase::Queued || self.maybe_created) && !subscribed;
        let orphan_next = match orphan_at.filter(|_| unclaimed && self.phase != Phase::Held) {
            Some(t) if t <= now => return Fate::Delete,
            _ => orphan_at.filter(|t| unclaimed && *t > now),
        };
        let next = match self.phase {
            Phase::Held => match self.deadline {
                Some(d) if d <= now => return Fate::Delete,
                d => d,
            },
            Phase::Queued if !subscribed && idle => return Fate::Delete,
            Phase::Queued if !subscribed => idle_at,
            Phase::New if self.maybe_created && idle => return Fate::Delete,
            Phase::New | Phase::Done if !subscribed && idle => return Fate::Forget,
            Phase::New | Phase::Done if !subscribed => idle_at,
            _ => None,
        };
        Fate::Keep([orphan_next, next].into_iter().flatten().min())
    }

    /// The conditions under which the key `key` is still this entry's: its value and, for an
    /// election candidate once its create revision is known, that revision too. An election's
    /// value is the bare description, which other candidates may share; the name (the own
    /// lease's id) and the create revision are what make the key ours.
    pub(super) fn owned(&self, key: &[u8]) -> Vec<super::pb::Compare> {
        let mut conds = vec![super::pb::value_is(key, &self.value)];
        let election = self.name.as_ref().is_some_and(LockName::is_election);
        if election && self.create_rev != 0 && key == self.key.as_bytes() {
            conds.push(super::pb::create_revision_is(key, self.create_rev));
        }
        conds
    }
}

/// Keeps the registry's subscription and the predecessor watch together: dropping the
/// subscription cancels the watch, and has the reaper look at the slot (a subscribed waiter's
/// key is never reaped, so nothing was planned for it).
pub(super) struct SubKeep {
    /// Taken first on drop, so that the reaper finds the slot unsubscribed.
    pub(super) alive: Option<Arc<()>>,
    pub(super) slot: Weak<Slot>,
    pub(super) shared: Weak<Shared>,
    pub(super) token: Token,
}

impl Drop for SubKeep {
    fn drop(&mut self) {
        self.alive.take();
        // Without the backend, its watch stream is gone too.
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        shared.reap_at(self.token, Instant::now());
        if let Some(w) = self.slot.upgrade().and_then(|s| s.take_watch()) {
            shared.watches.cancel(w);
        }
    }
}
