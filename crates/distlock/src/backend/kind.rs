//! What a hold is: [`LockKind`], the kind of lock an acquisition takes.

use std::fmt;

/// The kind of lock a hold belongs to. It is part of a [`LockName`](super::LockName), so it
/// reaches every method of [`Backend`](super::Backend) that acts on a hold (acquire, release,
/// extend); methods that look at a key as a whole (inspect, force release, list) see whatever
/// holds the key, of any kind.
///
/// All kinds of one key exclude each other as `flock -x` and `flock -s` do: a mutex or write
/// hold excludes every other hold of the key, read holds share the key with other read holds
/// only, and a semaphore's permits share it with other permits of the same semaphore only.
/// Fences strictly increase per key across every kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LockKind {
    /// The exclusive lock of [`LockRegistry::obtain`](crate::LockRegistry::obtain), in each
    /// backend's established mutex layout (Spring's `RedisLockRegistry`, Curator's
    /// `InterProcessMutex`, etcd's `concurrency.Mutex`, ...).
    Mutex,
    /// A shared hold of a read-write lock: any number of readers at once, no writer.
    Read,
    /// The exclusive hold of a read-write lock: no other holder of any kind. A writer that
    /// waits keeps new readers out, so a stream of readers cannot starve it.
    Write,
    /// One permit of a semaphore that lets at most `permits` holders in at once.
    Semaphore {
        /// How many holders the semaphore admits. Every holder of a key must agree on it;
        /// a backend that sees a disagreement refuses the attempt with
        /// [`Error::InvalidConfig`](crate::Error::InvalidConfig).
        permits: u32,
    },
}

/// The largest number of permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1_000_000;

impl LockKind {
    /// Whether a hold of this kind excludes every other hold of its key (mutex and write).
    pub fn is_exclusive(self) -> bool {
        matches!(self, LockKind::Mutex | LockKind::Write)
    }

    /// The number of holders this kind admits at once: 1 for the exclusive kinds, the permits
    /// of a semaphore, and `u32::MAX` (no bound) for readers.
    pub fn max_holders(self) -> u32 {
        match self {
            LockKind::Mutex | LockKind::Write => 1,
            LockKind::Read => u32::MAX,
            LockKind::Semaphore { permits } => permits,
        }
    }

    /// Whether holds of `self` and `other` on one key may overlap: readers with readers,
    /// permits of the same semaphore with each other, nothing else.
    pub fn shares_with(self, other: LockKind) -> bool {
        matches!(
            (self, other),
            (LockKind::Read, LockKind::Read)
                | (LockKind::Semaphore { .. }, LockKind::Semaphore { .. })
        )
    }

    /// A short lowercase name: `mutex`, `read`, `write`, `semaphore`; used in layouts, logs
    /// and the CLI's `status` and `list`.
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::Read => "read",
            LockKind::Write => "write",
            LockKind::Semaphore { .. } => "semaphore",
        }
    }

    /// Checks a number of permits: 1 to [`MAX_PERMITS`].
    pub fn semaphore(permits: u32) -> crate::Result<LockKind> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(crate::Error::config(format!(
                "a semaphore needs 1 to {MAX_PERMITS} permits, not {permits}"
            )));
        }
        Ok(LockKind::Semaphore { permits })
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockKind::Semaphore { permits } => write!(f, "semaphore({permits})"),
            other => f.write_str(other.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_share_a_key_only_with_their_own_shared_kind() {
        let sem = LockKind::Semaphore { permits: 3 };
        assert!(LockKind::Read.shares_with(LockKind::Read));
        assert!(sem.shares_with(sem));
        for exclusive in [LockKind::Mutex, LockKind::Write] {
            for other in [LockKind::Mutex, LockKind::Write, LockKind::Read, sem] {
                assert!(!exclusive.shares_with(other) && !other.shares_with(exclusive));
            }
        }
        assert!(!LockKind::Read.shares_with(sem));
        assert_eq!(sem.max_holders(), 3);
        assert_eq!(sem.to_string(), "semaphore(3)");
    }

    #[test]
    fn a_semaphore_needs_a_sane_number_of_permits() {
        assert!(LockKind::semaphore(0).is_err());
        assert!(LockKind::semaphore(MAX_PERMITS + 1).is_err());
        assert_eq!(
            LockKind::semaphore(4).unwrap(),
            LockKind::Semaphore { permits: 4 }
        );
    }
}
