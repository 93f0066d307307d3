//! What `inspect` and `list` show of a key, from its holders' entries in queue order.

use std::time::Duration;

use crate::backend::{LockInfo, LockKind};

/// A key held as `kind` by `holders` (each its entry's fence, a ZooKeeper `czxid` or an etcd
/// create revision, and its owner) with `waiters` entries behind them, its holders' lease ending
/// in `remaining` when the server says. The fence shown is the highest holder's: permits and
/// readers hold together, and the youngest of them is the one a store has seen last.
pub(crate) fn describe<'a>(
    kind: LockKind,
    holders: impl IntoIterator<Item = (i64, &'a str)>,
    waiters: usize,
    remaining: Option<Duration>,
) -> LockInfo {
    let (fences, owners): (Vec<i64>, Vec<String>) = holders
        .into_iter()
        .map(|(fence, owner)| (fence, owner.to_owned()))
        .unzip();
    let fence = fences.iter().max().and_then(|f| u64::try_from(*f).ok());
    LockInfo::new(fence, remaining)
        .with_kind(kind)
        .with_holders(u32::try_from(owners.len()).unwrap_or(u32::MAX))
        .with_waiters(u32::try_from(waiters).unwrap_or(u32::MAX))
        .with_owners(owners)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_holder_fence_and_every_owner_are_shown() {
        let kind = LockKind::Semaphore { permits: 3 };
        let info = describe(kind, [(7, "a"), (9, "b"), (8, "c")], 4, None);
        assert_eq!(info.fence, Some(9));
        assert_eq!(info.kind, Some(kind));
        assert_eq!(info.holders, Some(3));
        assert_eq!(info.waiters, Some(4));
        assert_eq!(info.owners, ["a", "b", "c"]);
        assert_eq!(info.remaining, None);
    }

    #[test]
    fn a_negative_fence_is_not_shown() {
        let info = describe(
            LockKind::Mutex,
            [(-1, "a")],
            0,
            Some(Duration::from_secs(3)),
        );
        assert_eq!(info.fence, None);
        assert_eq!(info.remaining, Some(Duration::from_secs(3)));
    }
}
