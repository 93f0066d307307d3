//! Leader election over a lock: [`Election`], [`Leadership`] and [`Leader`].
//!
//! An election is a mutex of its name, held through a [`LockName::for_election`]: the leader
//! is whoever holds it, its term is the hold's fence, and leadership is a lease, renewed and
//! lost exactly as a hold is. So every backend elects; where it is held (the key's mutex, or
//! the backend's own election layout) is told in [`Election`]'s docs and `docs/BACKENDS.md`.
//!
//! [`LockName::for_election`]: crate::LockName::for_election

use std::time::Duration;

use futures_util::stream::{self, Stream};

use crate::backend::{LockInfo, Owner};
use crate::error::Result;
use crate::guard::LockGuard;
use crate::lock::Lock;
use crate::renewal::compose_fence;

/// How often [`Election::observe`] asks who leads, by default.
pub const OBSERVE_EVERY: Duration = Duration::from_millis(200);

/// An election among the instances of a service, by name: see
/// [`LockRegistry::election`](crate::LockRegistry::election).
///
/// Where an election is held depends on the backend, so that the election's foreign clients
/// elect with us:
///
/// | backend | layout | foreign candidates |
/// |---|---|---|
/// | Redis, SQL, memory | the key's mutex itself | anything that takes the same lock (Spring's `LockRegistryLeaderInitiator` takes the lock of its role) |
/// | etcd | `concurrency.Election`: keys `<prefix>/<name>/<lease id hex>` whose value is the bare description; the lowest create revision leads | `etcdctl elect <prefix>/<name> ID`, Go's `concurrency.Election` |
/// | ZooKeeper | Curator's `LeaderLatch`: ephemeral sequential nodes `_c_<uuid>-latch-<seq>` under `<root>/<name>` whose data is the description; the lowest sequence leads | Curator's `LeaderLatch` with that path |
///
/// On etcd and ZooKeeper the description is stored exactly as given (it is the foreign
/// recipe's id), and a foreign leader's id is what [`Leader::description`] shows. There the
/// election is a recipe of its own beside the key's locks: on ZooKeeper it ignores the key's
/// mutex, readers, writers and permits and they ignore it (as Curator's `LeaderLatch` and
/// `InterProcessMutex` on one path do); on etcd both live in the same directory and, as
/// etcd's `Mutex` and `Election` of one name do, exclude each other. On the other backends the
/// election *is* the key's mutex. See `docs/BACKENDS.md`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use distlock::{LockRegistry, Owner, backends::memory::MemoryBackend};
/// let registry = LockRegistry::new(MemoryBackend::new());
/// let election = registry.election("scheduler")?;
/// let leading = election.campaign(Owner::new("web-1")?).await?;
/// let leader = election.leader().await?.expect("somebody leads");
/// assert_eq!(leader.description, "web-1");
/// assert_eq!(leader.term, leading.term());
/// tokio::select! {
///     _ = leading.lost() => { /* stop acting as the leader */ }
///     _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
/// }
/// leading.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    lock: Lock,
}

/// Who leads an election, as [`Election::leader`] and [`Election::observe`] see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's description ([`Owner`]), or [`UNKNOWN_OWNER`](crate::UNKNOWN_OWNER) for a
    /// foreign holder whose layout records none.
    pub description: String,
    /// The leader's term: its hold's fence as the backend records it, in the form of
    /// [`LockGuard::fence`] (the backend's fence shifted by the bits of local hand-overs). It
    /// increases with each new leader; where the backend's record of the fence can run ahead of
    /// the holder's (Redis: see [`LockInfo::fence`]), it may be above the leader's own
    /// [`Leadership::term`], never below.
    pub term: u64,
}

/// The leadership of one candidate: held until [`resign`](Self::resign), drop, or loss. As a
/// [`LockGuard`], it is renewed in the background, and [`lost`](Self::lost) completes when
/// the lease could not be kept.
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    description: Owner,
}

impl Election {
    /// The election held with the slot of `lock` (see `LockRegistry::election`).
    pub(crate) fn new(lock: Lock) -> Election {
        Election { lock }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.lock.key()
    }

    /// The same election with another lease for the leaderships won through it (see
    /// [`Lock::with_lease`]): how long a leader that died stays leader.
    pub fn with_lease(&self, lease: Duration) -> Result<Election> {
        Ok(Election {
            lock: self.lock.with_lease(lease)?,
        })
    }

    /// Waits until this candidate leads, described as `description`.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Lock::lock`]: a campaign dropped midway leaves nothing behind.
    pub async fn campaign(&self, description: Owner) -> Result<Leadership> {
        let guard = self.lock.with_owner(description.clone()).lock().await?;
        Ok(Leadership { guard, description })
    }

    /// Leads if nobody does, waiting at most `timeout` ([`Error::NotAcquired`] after it).
    ///
    /// [`Error::NotAcquired`]: crate::Error::NotAcquired
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Lock::try_lock_for`].
    pub async fn campaign_for(&self, description: Owner, timeout: Duration) -> Result<Leadership> {
        let guard = self
            .lock
            .with_owner(description.clone())
            .try_lock_for(timeout)
            .await?;
        Ok(Leadership { guard, description })
    }

    /// Who leads now, or `None`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.lock.inspect().await?.map(|info| leader_of(&info)))
    }

    /// The leaders one after another, checked every [`OBSERVE_EVERY`]: the current one first
    /// (`None` while nobody leads), then each change. Terms only increase, so the changes come
    /// in order; a leadership shorter than the interval may fall between two checks. An error
    /// of one check is an item too, and the stream goes on.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        self.observe_every(OBSERVE_EVERY)
    }

    /// [`observe`](Self::observe) with checks every `every` (at least 10 ms).
    pub fn observe_every(
        &self,
        every: Duration,
    ) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let every = every.max(Duration::from_millis(10));
        let election = self.clone();
        // `None` before the first item; then what was last told.
        stream::unfold(
            (election, None::<Option<Leader>>),
            move |(election, told)| async move {
                let mut first = told.is_none();
                loop {
                    if !first {
                        tokio::time::sleep(every).await;
                    }
                    first = false;
                    match election.leader().await {
                        Err(e) => return Some((Err(e), (election, told))),
                        Ok(now) => {
                            if told.as_ref() != Some(&now) {
                                return Some((Ok(now.clone()), (election, Some(now))));
                            }
                        }
                    }
                }
            },
        )
    }
}

/// What `inspect` says of the election's mutex, as a leader.
fn leader_of(info: &LockInfo) -> Leader {
    Leader {
        description: info
            .owners
            .first()
            .cloned()
            .unwrap_or_else(|| crate::UNKNOWN_OWNER.to_string()),
        term: info.fence.map_or(0, |f| compose_fence(f, 0)),
    }
}

impl Leadership {
    /// This leadership's term: larger than every earlier leader's (the hold's
    /// [`fence`](LockGuard::fence)). Pass it with what the leader writes, as a fence.
    pub fn term(&self) -> u64 {
        self.guard.fence()
    }

    /// How this leader is described.
    pub fn description(&self) -> &Owner {
        &self.description
    }

    /// True while this candidate leads: not reported lost and its lease not run out.
    pub fn is_leading(&self) -> bool {
        self.guard.is_held()
    }

    /// Completes when the leadership is lost (see [`LockGuard::lost`]).
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// The hold behind the leadership, for its lease and fence.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The hold behind the leadership, to use as a guard (for instance with
    /// [`LockGuard::release_not_before`]); releasing it resigns.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Steps down: the next candidate may lead at once. [`Error::LockLost`] if the
    /// leadership had been lost meanwhile.
    ///
    /// [`Error::LockLost`]: crate::Error::LockLost
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::memory::MemoryBackend;
    use crate::LockRegistry;

    /// The election has a handle of its own, flagged for the backend; a backend without an
    /// election layout (memory) keeps it as the key's mutex, so the two exclude each other.
    #[tokio::test]
    async fn election_handle_is_apart_but_memory_keeps_it_the_keys_mutex() {
        let registry = LockRegistry::new(MemoryBackend::new());
        let election = registry.election("jobs").unwrap();
        assert!(election.lock.slot.name.is_election());
        assert!(!registry.obtain("jobs").unwrap().slot.name.is_election());
        assert!(registry
            .election("jobs")
            .unwrap()
            .lock
            .slot
            .name
            .is_election());
        let leading = election.campaign(Owner::new("a").unwrap()).await.unwrap();
        assert!(registry.obtain("jobs").unwrap().try_lock().await.is_err());
        leading.resign().await.unwrap();
        let guard = registry.obtain("jobs").unwrap().lock().await.unwrap();
        assert!(election
            .campaign_for(Owner::new("b").unwrap(), Duration::from_millis(50))
            .await
            .is_err());
        guard.release().await.unwrap();
    }
}
