//! What `inspect`, `list` and `force_release` see of a key: its holders' entries in queue order,
//! read and deleted by the member ([`View`]), described and released the same way for all.

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;

use super::holders;
use crate::backend::{LockInfo, LockKind, LockName};
use crate::error::Result;

/// One entry of a key's queue: its kind, its fence (a ZooKeeper `czxid`, an etcd create
/// revision), who holds it as its data says, and the member's handle on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Queued<E> {
    pub(crate) kind: LockKind,
    pub(crate) fence: i64,
    pub(crate) owner: String,
    pub(crate) entry: E,
}

/// Who holds a key: held as `kind` by the entries `held`, with `waiters` entries behind them.
pub(crate) struct Holders<E> {
    pub(crate) kind: LockKind,
    pub(crate) held: Vec<Queued<E>>,
    pub(crate) waiters: usize,
}

impl<E> Holders<E> {
    /// The holders of a queue whose entries are `all`, oldest first; `None` when it is empty.
    pub(crate) fn of(mut all: Vec<Queued<E>>) -> Option<Self> {
        let (kind, n) = holders(all.iter().map(|q| q.kind))?;
        let waiters = all.len() - n;
        all.truncate(n);
        Some(Holders {
            kind,
            held: all,
            waiters,
        })
    }

    /// The key as `inspect` shows it, its holders' lease ending in `remaining` when the server
    /// says. The fence shown is the highest holder's: permits and readers hold together, and the
    /// youngest of them is the one a store has seen last.
    pub(crate) fn info(&self, remaining: Option<Duration>) -> LockInfo {
        let fence = self.held.iter().map(|q| q.fence).max();
        let owners: Vec<String> = self.held.iter().map(|q| q.owner.clone()).collect();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        LockInfo::new(fence.and_then(|f| u64::try_from(f).ok()), remaining)
            .with_kind(self.kind)
            .with_holders(count(owners.len()))
            .with_waiters(count(self.waiters))
            .with_owners(owners)
    }
}

/// A member's reads and deletions behind `inspect` and `force_release`.
pub(crate) trait View: Sync {
    /// The member's handle on an entry (a node's path, an etcd key).
    type Entry: Send + Sync;

    /// Who holds `name`'s key; `None` when nobody does.
    fn holders(
        &self,
        name: &LockName,
    ) -> impl Future<Output = Result<Option<Holders<Self::Entry>>>> + Send;

    /// When the holders' lease ends, when the server keeps one.
    fn remaining(
        &self,
        _h: &Holders<Self::Entry>,
    ) -> impl Future<Output = Option<Duration>> + Send {
        async { None }
    }

    /// Deletes a holder's entry whoever holds it; whether it was there.
    fn delete(&self, q: &Queued<Self::Entry>) -> impl Future<Output = Result<bool>> + Send;
}

/// What `inspect` says of `name`.
pub(crate) async fn inspect<V: View>(v: &V, name: &LockName) -> Result<Option<LockInfo>> {
    let Some(h) = v.holders(name).await? else {
        return Ok(None);
    };
    Ok(Some(h.info(v.remaining(&h).await)))
}

/// Deletes every holder entry of `name`'s key, as an operator (or a fault) would; whether one
/// was deleted.
pub(crate) async fn force_release<V: View>(v: &V, name: &LockName) -> Result<bool> {
    let Some(h) = v.holders(name).await? else {
        return Ok(false);
    };
    let mut deleted = false;
    for r in join_all(h.held.iter().map(|q| v.delete(q))).await {
        deleted |= r?;
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(kind: LockKind, fence: i64, owner: &str) -> Queued<()> {
        Queued {
            kind,
            fence,
            owner: owner.to_owned(),
            entry: (),
        }
    }

    #[test]
    fn the_highest_holder_fence_and_every_owner_are_shown() {
        let kind = LockKind::Semaphore { permits: 3 };
        let all = [(7, "a"), (9, "b"), (8, "c"), (10, "d"), (11, "e")];
        let h = Holders::of(all.iter().map(|(f, o)| q(kind, *f, o)).collect()).unwrap();
        let info = h.info(None);
        assert_eq!(info.fence, Some(9));
        assert_eq!(info.kind, Some(kind));
        assert_eq!(info.holders, Some(3));
        assert_eq!(info.waiters, Some(2));
        assert_eq!(info.owners, ["a", "b", "c"]);
        assert_eq!(info.remaining, None);
        assert!(Holders::<()>::of(Vec::new()).is_none());
    }

    #[test]
    fn a_negative_fence_is_not_shown() {
        let h = Holders::of(vec![q(LockKind::Mutex, -1, "a")]).unwrap();
        let info = h.info(Some(Duration::from_secs(3)));
        assert_eq!(info.fence, None);
        assert_eq!(info.remaining, Some(Duration::from_secs(3)));
    }
}
