//! Where a contender stands in its key's queue, and who holds the key: one answer for every
//! kind, from the kinds of the entries in queue order alone (see [`LockKind::shares_with`]).

use crate::backend::LockKind;

/// What a contender's place in its key's queue says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict<T> {
    /// Nothing before it keeps it out: it holds.
    Holds,
    /// It waits for this entry before it: the nearest one whose kind it does not share the key
    /// with (a later one going changes nothing while this one stays).
    Behind(T),
    /// A permit behind at least as many permits as its semaphore has: it waits for one of
    /// them to go, whichever it is.
    Full {
        /// The semaphore's number of permits.
        permits: u32,
    },
    /// A permit before it belongs to a semaphore with this other number of permits.
    Disagrees(u32),
}

/// The verdict for a contender of `kind` whose predecessors are `before`, oldest first, with
/// the entry each stands for. A predecessor's semaphore with 0 permits is one whose number is
/// unknown (a foreign client's, or unreadable): it counts, but never disagrees.
///
/// A mutex or writer waits for its nearest predecessor, a reader for the nearest one that is
/// not a reader, a permit for the nearest one that is not a permit or, behind permits only,
/// until fewer than its number of them are before it. So an older waiting writer keeps later
/// readers out, and no kind overtakes another.
pub(crate) fn verdict<T>(
    kind: LockKind,
    before: impl IntoIterator<Item = (LockKind, T)>,
) -> Verdict<T> {
    let permits = match kind {
        LockKind::Semaphore { permits } => Some(permits),
        _ => None,
    };
    let mut blocker = None;
    let mut disagrees = None;
    let mut count = 0usize;
    for (other, entry) in before {
        count += 1;
        if let (Some(mine), LockKind::Semaphore { permits: p }) = (permits, other) {
            if p != mine && p != 0 && disagrees.is_none() {
                disagrees = Some(p);
            }
        }
        if !other.shares_with(kind) {
            blocker = Some(entry);
        }
    }
    match (disagrees, blocker, permits) {
        (Some(p), _, _) => Verdict::Disagrees(p),
        (None, Some(entry), _) => Verdict::Behind(entry),
        (None, None, Some(permits)) if count >= permits as usize => Verdict::Full { permits },
        (None, None, _) => Verdict::Holds,
    }
}

/// Who holds a key whose entries have the kinds `all`, oldest first: the kind of the oldest
/// entry and how many of the first entries hold. That is the oldest alone, or, if it is a
/// reader or a permit, the readers or permits right after it too (for a semaphore at most its
/// number, which is its first entry's; every one of the run when that is 0, unknown). `None`
/// when there is no entry.
pub(crate) fn holders(all: impl IntoIterator<Item = LockKind>) -> Option<(LockKind, usize)> {
    let mut all = all.into_iter();
    let first = all.next()?;
    let run = || 1 + all.take_while(|k| k.shares_with(first)).count();
    let n = match first {
        LockKind::Read => run(),
        LockKind::Semaphore { permits: 0 } => run(),
        LockKind::Semaphore { permits } => run().min(permits as usize),
        _ => 1,
    };
    Some((first, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockKind::{Mutex, Read, Write};

    const SEM2: LockKind = LockKind::Semaphore { permits: 2 };
    const SEM3: LockKind = LockKind::Semaphore { permits: 3 };
    const SEM_UNKNOWN: LockKind = LockKind::Semaphore { permits: 0 };

    /// The verdict for `kind` behind `before`, its entries named by their index.
    fn judge(kind: LockKind, before: &[LockKind]) -> Verdict<usize> {
        verdict(kind, before.iter().copied().zip(0..))
    }

    #[test]
    fn the_first_contender_of_every_kind_holds() {
        for kind in [Mutex, Read, Write, SEM2] {
            assert_eq!(judge(kind, &[]), Verdict::Holds, "{kind}");
        }
    }

    #[test]
    fn exclusive_kinds_wait_for_the_nearest_predecessor_of_any_kind() {
        let queues: [&[LockKind]; 4] = [
            &[Read, Read],
            &[Mutex, Write],
            &[SEM2, Read, SEM2],
            &[Write, Read, Mutex],
        ];
        for kind in [Mutex, Write] {
            for before in queues {
                assert_eq!(judge(kind, before), Verdict::Behind(before.len() - 1));
            }
        }
    }

    #[test]
    fn readers_wait_for_the_nearest_predecessor_that_is_not_a_reader() {
        assert_eq!(judge(Read, &[Read, Read]), Verdict::Holds);
        assert_eq!(judge(Read, &[Read, Write, Read]), Verdict::Behind(1));
        assert_eq!(judge(Read, &[Mutex, Read, Read]), Verdict::Behind(0));
        // A waiting writer keeps later readers out, and so do permits.
        assert_eq!(judge(Read, &[Write, Mutex, Read]), Verdict::Behind(1));
        assert_eq!(judge(Read, &[Read, SEM2]), Verdict::Behind(1));
    }

    #[test]
    fn permits_count_the_permits_before_them() {
        assert_eq!(judge(SEM2, &[SEM2]), Verdict::Holds);
        assert_eq!(judge(SEM2, &[SEM2, SEM2]), Verdict::Full { permits: 2 });
        assert_eq!(judge(SEM3, &[SEM3, SEM3]), Verdict::Holds);
        // Permits of unknown number count, and do not disagree.
        assert_eq!(judge(SEM2, &[SEM_UNKNOWN]), Verdict::Holds);
        assert_eq!(
            judge(SEM2, &[SEM_UNKNOWN, SEM2]),
            Verdict::Full { permits: 2 }
        );
        let one = LockKind::Semaphore { permits: 1 };
        assert_eq!(judge(one, &[one]), Verdict::Full { permits: 1 });
    }

    #[test]
    fn permits_wait_for_the_nearest_predecessor_of_another_kind() {
        assert_eq!(judge(SEM2, &[Read]), Verdict::Behind(0));
        assert_eq!(judge(SEM2, &[Mutex, SEM2]), Verdict::Behind(0));
        assert_eq!(judge(SEM3, &[SEM3, Write, SEM3]), Verdict::Behind(1));
        // Behind another kind it waits for that one, however many permits are before it.
        assert_eq!(judge(SEM2, &[SEM2, SEM2, Mutex]), Verdict::Behind(2));
    }

    #[test]
    fn permits_of_another_number_disagree_wherever_they_are() {
        assert_eq!(judge(SEM2, &[SEM3]), Verdict::Disagrees(3));
        assert_eq!(judge(SEM2, &[SEM3, Mutex]), Verdict::Disagrees(3));
        assert_eq!(judge(SEM2, &[SEM2, SEM3, SEM2]), Verdict::Disagrees(3));
        // Only permits disagree: other kinds do not know a number.
        assert_eq!(judge(Read, &[SEM3]), Verdict::Behind(0));
        assert_eq!(judge(Mutex, &[SEM3]), Verdict::Behind(0));
    }

    #[test]
    fn election_candidates_queue_as_mutexes() {
        // An election's candidates are the mutexes of its name: the first one leads.
        assert_eq!(judge(Mutex, &[]), Verdict::Holds);
        assert_eq!(judge(Mutex, &[Mutex, Mutex, Mutex]), Verdict::Behind(2));
        assert_eq!(holders([Mutex, Mutex, Mutex]), Some((Mutex, 1)));
    }

    #[test]
    fn holders_are_the_oldest_entry_or_its_shared_run() {
        assert_eq!(holders([]), None);
        assert_eq!(holders([Write, Read]), Some((Write, 1)));
        assert_eq!(holders([Mutex, Mutex]), Some((Mutex, 1)));
        assert_eq!(holders([Read, Read, Write, Read]), Some((Read, 2)));
        assert_eq!(holders([Read, SEM2]), Some((Read, 1)));
        assert_eq!(holders([SEM2, SEM2, SEM2, Mutex]), Some((SEM2, 2)));
        assert_eq!(holders([SEM3, SEM3, Read, SEM3]), Some((SEM3, 2)));
        // A semaphore of unknown number: every permit of the run holds.
        assert_eq!(
            holders([SEM_UNKNOWN, SEM_UNKNOWN, SEM_UNKNOWN]),
            Some((SEM_UNKNOWN, 3))
        );
        // Its first permit's number bounds the run, whatever the others say.
        assert_eq!(holders([SEM2, SEM3, SEM3]), Some((SEM2, 2)));
    }
}
