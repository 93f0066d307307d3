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
use crate::backends::contenders::{Contender, Locked, Rules, Stage, Table};

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
            entry: Arc::new(tokio::sync::Mutex::new(Entry::new(OwnKey::default()))),
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

/// What this instance knows of a token's key on the server, in its [`Contender`].
pub(super) type Entry = Contender<OwnKey>;

#[derive(Default)]
pub(super) struct OwnKey {
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
    /// While `maybe_created`: the other name that create may have used (a waiter's, on this
    /// session), deleted with `key` and freed when the key is forgotten.
    pub(super) alt: Option<(String, Arc<Session>)>,
    /// What the last attempt found we wait for (the key created just before ours, for a mutex).
    pub(super) pred: Option<WatchTarget>,
    /// After the last look at the queue: the contenders ahead, and the slot's signal's
    /// generation (a later one means the predecessor's watch fired since).
    pub(super) seen: (Option<u32>, u64),
}

/// The reaper's rules (see [`Contender::fate`]): an unsubscribed waiter idle for
/// [`WAITER_IDLE`] is gone, and so is a failed attempt nobody came back to within
/// [`ORPHAN_GRACE`].
pub(super) const RULES: Rules = Rules {
    idle: Some(WAITER_IDLE),
    orphan_grace: Some(ORPHAN_GRACE),
};

impl Shared {
    pub(super) fn slot_for(&self, token: Token) -> Arc<Slot> {
        self.slots
            .get_or_insert_with(token, || Arc::new(Slot::new()))
    }
}

impl Entry {
    /// The key is gone while queued or about to hold: the next round queues it again.
    pub(super) fn requeue(&mut self) {
        self.stage = Stage::New;
        self.create_rev = 0;
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
        shared.slots.reap_by(self.token, Instant::now());
        if let Some(w) = self.slot.upgrade().and_then(|s| s.take_watch()) {
            shared.watches.cancel(w);
        }
    }
}
