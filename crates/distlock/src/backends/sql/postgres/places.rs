//! This backend's own bookkeeping of its waiters' entries in the wait table: which key each
//! waits for, its place once taken, when it was last renewed. The protocol that keeps the
//! entries is in `wait.rs`; apart so that the backend's state (`state.rs`) holds it without
//! importing the protocol, which works on that state.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Instant;

/// The wait-table state of one backend.
#[derive(Default)]
pub(crate) struct Waits {
    /// Whether the wait table exists (see `run::ensure_table`).
    pub(super) ready: AtomicBool,
    /// This backend's waiters, by their owner value (the entry's `waiter`).
    entries: Mutex<HashMap<String, Entry>>,
}

/// One waiter's entry, as this backend knows it.
pub(super) struct Entry {
    /// The key's row, as the statements' `$1`, `$2`.
    pub(super) row: (String, String),
    /// The entry's place once it was taken; kept when a release takes the entry out, so that a
    /// waiter that comes back keeps its turn.
    pub(super) seq: Option<i64>,
    /// When the entry was last taken or renewed.
    pub(super) renewed: Instant,
    /// A release took the entry out (and woke the waiter).
    pub(super) taken: bool,
}

impl Waits {
    pub(super) fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}
