//! The contender-queue family: backends where every contender for a key writes an ordered
//! entry of its own (a ZooKeeper sequential node, an etcd key ordered by create revision) and
//! waits for the entry before it to go, rather than retrying. ZooKeeper and etcd are its
//! members. What their layouts share is decided here once, free of I/O: who holds a key and
//! where a contender stands ([`verdict`]). Each backend reads its own layout into ordered
//! `(kind, entry)` lists and acts on the answer. Both also run their reaper on [`reaper`]: one
//! task per backend that deletes entries whose time ran out, and background deletion retries;
//! keep what they know of their own entries in one [`Table`] per backend, by owner token; and
//! show and force-release a key's holders the same way ([`View`]: the member reads the holders
//! and deletes one entry). What a member knows of one token's entry is a [`Contender`]: its life
//! (queued, held until a deadline, to be deleted) and the reaper's decision on it
//! ([`Contender::fate`]), around the member's own handle on what it has on the server.

pub(crate) mod attempt;
mod entry;
pub(crate) mod reaper;
mod table;
mod verdict;
mod view;

use std::time::Duration;

use crate::backend::{Backend, LockName, Renewal, Token};
use crate::error::{Error, Result};

pub(crate) use entry::{Contender, Fate, Rules, Stage};
pub(crate) use table::Table;
pub(crate) use verdict::{holders, verdict, Verdict};
pub(crate) use view::{force_release, inspect, Holders, Queued, View};

/// `extend` as a batch of one for the member's `extend_many`: both members renew in that one
/// path, so that a manual renewal is checked exactly as the renewal task's.
pub(crate) async fn extend_one<B: Backend + ?Sized>(
    b: &B,
    kind: &'static str,
    name: &LockName,
    token: Token,
    lease: Duration,
) -> Result<bool> {
    let name = name.clone();
    let one = b.extend_many(&[Renewal { name, token, lease }]).await;
    let answer = one.into_iter().next();
    answer.unwrap_or_else(|| Err(Error::backend(kind, "renewal not answered")))
}

/// A std mutex's guard, the lock taken over when a panic poisoned it: every change the
/// family makes under one of its mutexes leaves the data whole.
pub(crate) trait Locked<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T>;
}

impl<T> Locked<T> for std::sync::Mutex<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}
