//! [`LockGuard`]: proof of holding a lock, with its fence, the lost-lock signal, extension and
//! release.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::Token;
use crate::error::{Error, Result};
use crate::options::check_lease;
use crate::renewal::Hold;
use crate::state::{Inner, ReadGroup, Slot, SlotState};

/// What a guard owns besides its remote hold, by kind of lock.
pub(crate) enum Ownership {
    /// The local lock of an exclusive kind (mutex, write), kept for the guard's life; the
    /// remote hold may pass to the next local holder.
    Exclusive(OwnedMutexGuard<SlotState>),
    /// A place among the local readers that share one remote read hold.
    Reader(Arc<ReadGroup>),
    /// Nothing: the remote hold is the guard's alone (a semaphore permit).
    Alone,
    /// Given up (released, or passed on).
    Done,
}

/// A remote hold to release, with the local lock to let go after it (exclusive kinds).
pub(crate) struct ToRelease {
    local: Option<OwnedMutexGuard<SlotState>>,
    hold: Arc<Hold>,
}

/// A held lock (a mutex, either side of a read-write lock, or a semaphore permit). Obtained
/// from [`Lock::lock`](crate::Lock::lock) and friends.
///
/// While the guard lives, the registry's renewal task extends its lease at about a third of
/// the lease. If the lock is nevertheless lost (the lease ran out unconfirmed, or somebody
/// deleted it on the server), [`is_held`](Self::is_held) turns false, [`lost`](Self::lost)
/// completes, and every operation returns [`Error::LockLost`].
///
/// Give the lock back with [`release`](Self::release), which reports whether it was still held.
///
/// # Drop
/// Dropping the guard never blocks. If a local task is waiting for the same key, the remote
/// hold (and its renewal) passes straight to that task (exclusive kinds); a reader's share
/// of a remote read hold that other local readers still use stays with them. Otherwise
/// renewal stops at once and,
/// when a Tokio runtime is running, the lock is released on the server by a background task
/// (a local waiter that arrives meanwhile starts after that release completes). Without a
/// runtime nothing can be sent: the lock stays taken on the server until its lease expires.
/// A runtime that ends drops the task unfinished: a process about to end waits for it with
/// [`LockRegistry::flush`](crate::LockRegistry::flush). The guard of a
/// [`Lock::with_at_least`](crate::Lock::with_at_least) dropped before its at-least time keeps
/// the lock (renewed, and not handed to a local waiter) until then, in a background task that
/// `flush` also waits for.
#[must_use = "dropping the guard releases the lock (in the background) at once"]
pub struct LockGuard {
    slot: Arc<Slot>,
    registry: Arc<Inner>,
    ownership: Ownership,
    hold: Arc<Hold>,
    fence: u64,
    /// [`Lock::with_at_least`](crate::Lock::with_at_least): no release before this.
    keep_until: Option<Instant>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.slot.name)
            .field("fence", &self.fence)
            .field("held", &self.hold.is_held())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(
        slot: Arc<Slot>,
        registry: Arc<Inner>,
        ownership: Ownership,
        hold: Arc<Hold>,
        fence: u64,
    ) -> Self {
        LockGuard {
            slot,
            registry,
            ownership,
            hold,
            fence,
            keep_until: None,
        }
    }

    /// Keeps the lock until `until` whatever ends the guard (see
    /// [`Lock::with_at_least`](crate::Lock::with_at_least)).
    pub(crate) fn keep_until(mut self, until: Option<Instant>) -> Self {
        self.keep_until = until;
        self
    }

    /// Waits, renewing, until the guard's keep-until (if any) or until the lock is lost.
    async fn kept(&mut self) {
        if let Some(until) = self.keep_until.take() {
            let lost = self.lost();
            tokio::select! {
                () = lost => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.slot.name.key()
    }

    /// The kind of lock held.
    pub fn kind(&self) -> crate::LockKind {
        self.slot.name.kind()
    }

    /// The fencing token of this acquisition: larger than that of every earlier holder of the
    /// key (see [`Capabilities::fencing`](crate::Capabilities) for how far a backend promises
    /// this). Pass it with every write the lock protects and let the storage reject writes
    /// with a smaller fence than it has seen: that is what stops a holder that was paused past
    /// its lease. The backend's own fence is `fence() >> 10`; the low 10 bits count local
    /// handoffs of one remote hold.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The owner token of the remote hold (shared by the local readers of one remote read
    /// hold).
    pub fn token(&self) -> Token {
        self.hold.token
    }

    /// True while the lock is held: not reported lost and its lease not run out.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// `Ok(())` while held, else [`Error::LockLost`]: a cheap check before a protected write.
    pub fn ensure_held(&self) -> Result<()> {
        if self.hold.is_held() {
            Ok(())
        } else {
            Err(self.lost_error())
        }
    }

    /// The lease left as far as this client can tell (zero once lost).
    pub fn remaining(&self) -> Duration {
        self.hold.remaining()
    }

    /// Completes when the lock is lost; pending for as long as it is held. Use it in
    /// `tokio::select!` to stop work that must not outlive the lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// # use distlock::{LockRegistry, backends::memory::MemoryBackend};
    /// # let registry = LockRegistry::new(MemoryBackend::new());
    /// let guard = registry.obtain("report")?.lock().await?;
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lock lost: stop writing"),
    ///     _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let hold = self.hold.clone();
        async move { hold.lost().await }
    }

    /// Sets the lease to `lease` from now, owner-checked on the server, and renews at that
    /// lease from then on.
    ///
    /// Bounded by the lease it extends: a request that has not answered when the current
    /// lease ends (as the client counts it) marks the lock lost and fails with
    /// [`Error::LockLost`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropped midway, the extension may or may not have reached the server; the guard
    /// keeps counting its old lease, which ends no later than the server's.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        check_lease(lease)?;
        self.ensure_held()?;
        let sent = Instant::now();
        let request = self
            .registry
            .backend
            .extend(&self.hold.name, self.hold.token, lease)
            .instrument(tracing::debug_span!(
                "distlock.extend",
                key = %self.key(),
                client = %self.registry.opts.client_id(),
            ));
        let Ok(reply) = tokio::time::timeout_at(self.hold.valid_until(), request).await else {
            self.hold
                .mark_lost("the extension did not answer before the lease ended");
            return Err(self.lost_error());
        };
        let ok = reply?;
        if ok {
            self.hold.confirm(sent, lease);
            self.registry.renewer.rescheduled(&self.hold);
            Ok(())
        } else {
            self.hold.mark_lost("extension found it gone");
            Err(self.lost_error())
        }
    }

    /// Gives the lock back no earlier than `not_before`: until then the lock stays held (and
    /// renewed), however soon the work ended. This is ShedLock's `lockAtLeastFor`: a
    /// scheduled job that finished in a second is not run again at once by another instance
    /// whose clock or schedule is a little off. Returns at once with [`Error::LockLost`] if
    /// the lock is lost while it waits, else as [`release`](Self::release).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// # use distlock::{LockRegistry, backends::memory::MemoryBackend};
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// # let registry = LockRegistry::new(MemoryBackend::new());
    /// let started = Instant::now();
    /// let guard = registry.obtain("nightly-report")?.lock().await?;
    /// // ... the job, done quickly ...
    /// guard.release_not_before(started + Duration::from_millis(50)).await?;
    /// assert!(started.elapsed() >= Duration::from_millis(50));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropped while it waits, the guard is dropped: the lock is released in the background
    /// at once, as on any drop.
    pub async fn release_not_before(mut self, not_before: Instant) -> Result<()> {
        self.keep_until = Some(self.keep_until.map_or(not_before, |k| k.max(not_before)));
        self.release().await
    }

    /// Gives the lock back. `Ok(())` when it was still held; [`Error::LockLost`] when it had
    /// been lost meanwhile (nothing is then released: somebody else may hold it). A transient
    /// failure ([`Error::Unavailable`]: the server restarting, a connection reset) is returned
    /// and the release goes on in the background, tried again until the server takes it or
    /// the lease ends, so that the key is not left held by nobody for the rest of its lease
    /// ([`LockRegistry::flush`](crate::LockRegistry::flush) waits for it). A guard of a
    /// [`Lock::with_at_least`](crate::Lock::with_at_least) first waits, renewing, until its
    /// at-least time (or the loss of the lock).
    ///
    /// # Cancel safety
    /// Dropped before its first poll, the future drops the guard, which releases in the
    /// background (see Drop). Dropped while the release request is in flight, renewal has
    /// already stopped: the lock is released if the request reached the server, and otherwise
    /// expires with its lease. Either way nothing stays held beyond the lease.
    pub async fn release(mut self) -> Result<()> {
        self.kept().await;
        let span = tracing::debug_span!(
            "distlock.release",
            key = %self.key(),
            fence = self.fence,
            client = %self.registry.opts.client_id(),
        );
        let Some(ToRelease { local, hold }) = self.give_up() else {
            return Ok(()); // handed to a local waiter, or other local readers go on with it
        };
        async move {
            if !hold.is_held() {
                crate::metrics::release(self.registry.backend.kind(), "lost");
                // Our token may still be on the server if only the client-side clock ran out.
                self.registry
                    .release_in_background(hold.name.clone(), hold.token);
                drop(local);
                return Err(self.lost_error());
            }
            let res = self.registry.release_hold(local, &hold).await;
            let kind = self.registry.backend.kind();
            match res {
                Ok(true) => {
                    crate::metrics::release(kind, "released");
                    Ok(())
                }
                Ok(false) => {
                    crate::metrics::release(kind, "lost");
                    Err(self.lost_error())
                }
                Err(e) => {
                    crate::metrics::release(kind, "error");
                    Err(e)
                }
            }
        }
        .instrument(span)
        .await
    }

    fn lost_error(&self) -> Error {
        Error::LockLost {
            key: self.key().to_owned(),
        }
    }

    /// Ends this guard's ownership. Returns the remote hold when it must be released (with
    /// the local lock, for an exclusive kind), `None` when it passed to a local waiter or
    /// other local readers still share it.
    fn give_up(&mut self) -> Option<ToRelease> {
        let hold = self.hold.clone();
        match std::mem::replace(&mut self.ownership, Ownership::Done) {
            Ownership::Done => None,
            Ownership::Exclusive(local) => {
                let local = self.registry.give_up(&self.slot, local, &hold)?;
                Some(ToRelease {
                    local: Some(local),
                    hold,
                })
            }
            Ownership::Reader(group) => {
                if !group.leave() {
                    return None;
                }
                let mut current = self.slot.readers();
                if current.as_ref().is_some_and(|g| Arc::ptr_eq(g, &group)) {
                    *current = None;
                }
                drop(current);
                self.registry.renewer.deregister(&hold);
                Some(ToRelease { local: None, hold })
            }
            Ownership::Alone => {
                self.registry.renewer.deregister(&hold);
                Some(ToRelease { local: None, hold })
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(until) = self.keep_until.take().filter(|u| *u > Instant::now()) {
            if !matches!(self.ownership, Ownership::Done) {
                // Kept for `with_at_least`: the hold (renewed, and not handed to a local
                // waiter) moves to a guard that a background task drops at `until`.
                let later = LockGuard {
                    slot: self.slot.clone(),
                    registry: self.registry.clone(),
                    ownership: std::mem::replace(&mut self.ownership, Ownership::Done),
                    hold: self.hold.clone(),
                    fence: self.fence,
                    keep_until: None,
                };
                let lost = later.lost();
                // Without a runtime the closure, `later` with it, is dropped at once: a
                // plain drop.
                self.registry.background.spawn(async move {
                    tokio::select! {
                        () = lost => {}
                        () = tokio::time::sleep_until(until) => {}
                    }
                    drop(later);
                });
                return;
            }
        }
        let Some(ToRelease { local, hold }) = self.give_up() else {
            return;
        };
        let registry = self.registry.clone();
        let name = hold.name.clone();
        let spawned = self.registry.background.spawn(async move {
            if let Err(e) = registry.release_hold(local, &hold).await {
                tracing::debug!(lock = ?hold.name, error = %e, "release on drop failed; the lease will expire");
            }
        });
        if !spawned {
            tracing::debug!(lock = ?name, "guard dropped outside a runtime; the lease will expire");
        }
    }
}
