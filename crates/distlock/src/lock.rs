//! [`Lock`] and [`ReadWriteLock`]: the handles a registry hands out by key. The path of an
//! acquisition through a handle is in `acquire.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{LockInfo, LockKind, Owner};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::options::{check_lease, MAX_LEASE};
use crate::state::{Inner, Slot};

mod acquire;

/// How long an acquisition may wait.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    No,
    Until(Instant),
    Forever,
}

impl Wait {
    pub(crate) fn deadline(self) -> Option<Instant> {
        match self {
            Wait::No => Some(Instant::now()),
            Wait::Until(d) => Some(d),
            Wait::Forever => None,
        }
    }
}

/// A handle on one key of a [`LockRegistry`](crate::LockRegistry). Cheap to clone; all
/// handles of a key share one local lock.
#[derive(Clone)]
pub struct Lock {
    pub(crate) slot: Arc<Slot>,
    pub(crate) registry: Arc<Inner>,
    pub(crate) lease: Duration,
    pub(crate) owner: Owner,
    pub(crate) at_least: Option<Duration>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.slot.name)
            .field("lease", &self.lease)
            .field("owner", &self.owner)
            .finish()
    }
}

impl Lock {
    /// The key.
    pub fn key(&self) -> &str {
        self.slot.name.key()
    }

    /// The kind of the holds taken through this handle: [`LockKind::Mutex`] from
    /// [`LockRegistry::obtain`](crate::LockRegistry::obtain), [`LockKind::Read`] or
    /// [`LockKind::Write`] from a [`ReadWriteLock`], [`LockKind::Semaphore`] from
    /// [`LockRegistry::semaphore`](crate::LockRegistry::semaphore).
    pub fn kind(&self) -> LockKind {
        self.slot.name.kind()
    }

    /// The lease that acquisitions through this handle ask for.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The same lock with another lease for the acquisitions made through the returned handle.
    /// Fails when the lease is shorter than 10 ms or longer than a day.
    pub fn with_lease(&self, lease: Duration) -> Result<Lock> {
        check_lease(lease)?;
        Ok(Lock {
            lease,
            ..self.clone()
        })
    }

    /// Who the holds taken through this handle say they are (the registry's
    /// [`owner`](crate::RegistryOptions::owner) unless [`with_owner`](Self::with_owner) named another).
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The same lock, its holds described as `owner` (see [`Owner`]): for instance a job's
    /// name, so that `distlock list` tells which job holds the key.
    pub fn with_owner(&self, owner: Owner) -> Lock {
        Lock {
            owner,
            ..self.clone()
        }
    }

    /// The same lock, each of whose holds is kept at least `at_least` after it was acquired,
    /// however soon it is released or dropped: ShedLock's `lockAtLeastFor`, for a scheduled
    /// job that another instance, whose clock or schedule is a little off, must not run again
    /// at once. The hold is renewed meanwhile, and not handed to a local waiter before then.
    /// Fails when `at_least` is longer than a day ([`MAX_LEASE`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// # use distlock::{LockRegistry, backends::memory::MemoryBackend};
    /// use std::time::Duration;
    /// # let registry = LockRegistry::new(MemoryBackend::new());
    /// let job = registry.obtain("nightly-report")?.with_at_least(Duration::from_millis(50))?;
    /// let started = tokio::time::Instant::now();
    /// job.lock().await?.release().await?; // the job was quick; the lock was not
    /// assert!(started.elapsed() >= Duration::from_millis(50));
    /// # Ok(()) }
    /// ```
    pub fn with_at_least(&self, at_least: Duration) -> Result<Lock> {
        if at_least > MAX_LEASE {
            return Err(Error::InvalidConfig(format!(
                "at_least {at_least:?} is longer than a day"
            )));
        }
        Ok(Lock {
            at_least: (!at_least.is_zero()).then_some(at_least),
            ..self.clone()
        })
    }

    /// See [`with_at_least`](Self::with_at_least).
    pub fn at_least(&self) -> Option<Duration> {
        self.at_least
    }

    /// Waits until the lock is acquired, however long that takes.
    ///
    /// The async API is not reentrant: a task that calls `lock` while it holds a guard of the
    /// same key waits for itself (use [`try_lock_for`](Self::try_lock_for) to bound that, or
    /// pass the guard along). The [`blocking`](crate::blocking) facade is reentrant per thread.
    ///
    /// A backend error ends the wait with that error, so an outage is reported rather than
    /// waited out; [`try_lock_for`](Self::try_lock_for) retries transient errors
    /// ([`Error::is_retryable`]) within its timeout instead.
    ///
    /// Whatever way an acquisition ends without a guard (an error, a timeout, cancellation),
    /// it leaves no lock held: if any of its attempts may have succeeded on the server without
    /// the reply arriving, its token is released in the background, after that attempt ended.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no waiter entry behind and no lock held (a remote
    /// attempt that was in flight is driven to its end in the background and then given back,
    /// so the release cannot overtake it;
    /// [`LockRegistry::flush`](crate::LockRegistry::flush) waits for that).
    pub async fn lock(&self) -> Result<LockGuard> {
        self.acquire(Wait::Forever).await
    }

    /// Takes the lock if it is free right now, else fails with [`Error::NotAcquired`]. Makes one
    /// remote attempt at most.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<LockGuard> {
        self.acquire(Wait::No).await
    }

    /// Waits at most `timeout` for the lock, else fails with [`Error::NotAcquired`]. Transient
    /// backend errors are retried within the timeout. The timeout also bounds a request in
    /// flight: a reply due after it is not waited for (the attempt is undone in the
    /// background, as for a cancelled [`lock`](Self::lock)). A zero timeout is
    /// [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_for(&self, timeout: Duration) -> Result<LockGuard> {
        if timeout.is_zero() {
            return self.acquire(Wait::No).await;
        }
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.acquire(Wait::Until(deadline)).await,
            None => self.acquire(Wait::Forever).await,
        }
    }

    /// Reads the state of the lock's key on the backend, whatever kind holds it: `None` when
    /// nobody holds it.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<Option<LockInfo>> {
        self.registry.backend.inspect(&self.slot.name).await
    }
}

/// A read-write lock: its two sides are [`Lock`] handles with the usual `lock`, `try_lock`
/// and `try_lock_for` (and leases, renewal, lost signal and fences). From
/// [`LockRegistry::read_write`](crate::LockRegistry::read_write).
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    pub(crate) read: Lock,
    pub(crate) write: Lock,
}

impl ReadWriteLock {
    /// The key.
    pub fn key(&self) -> &str {
        self.read.key()
    }

    /// The shared side: its guards hold the key together with other readers.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The exclusive side: its guard holds the key alone.
    pub fn write(&self) -> &Lock {
        &self.write
    }

    /// The same lock with another lease for the acquisitions made through the returned
    /// handles (see [`Lock::with_lease`]).
    pub fn with_lease(&self, lease: Duration) -> Result<ReadWriteLock> {
        Ok(ReadWriteLock {
            read: self.read.with_lease(lease)?,
            write: self.write.with_lease(lease)?,
        })
    }

    /// The same lock, its holds described as `owner` (see [`Lock::with_owner`]).
    pub fn with_owner(&self, owner: Owner) -> ReadWriteLock {
        ReadWriteLock {
            read: self.read.with_owner(owner.clone()),
            write: self.write.with_owner(owner),
        }
    }
}
