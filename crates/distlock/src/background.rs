//! Undo work the registry leaves to background tasks (a release on drop, giving back an
//! abandoned attempt's token, leaving a wait queue), counted so that a process can wait for it
//! before its runtime ends ([`LockRegistry::flush`]). A runtime that shuts down drops its
//! tasks unfinished: without the wait, what they were to give back stays held or queued on
//! the server until its lease runs out.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{LockName, Token};
use crate::error::Error;
use crate::registry::{Inner, LockRegistry};

/// The registry's background undo tasks that have not ended yet.
#[derive(Default)]
pub(crate) struct Background(Arc<Count>);

#[derive(Default)]
struct Count {
    pending: AtomicUsize,
    idle: Notify,
}

/// One counted task: uncounted when it ends, also when its runtime drops it unfinished.
struct Pending(Arc<Count>);

impl Drop for Pending {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Background {
    /// Runs `undo` on the current runtime, counted until it ends. Returns false, running
    /// nothing, outside a runtime: then the server's lease is the only undo.
    pub(crate) fn spawn(&self, undo: impl Future<Output = ()> + Send + 'static) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        self.0.pending.fetch_add(1, Ordering::AcqRel);
        let pending = Pending(self.0.clone());
        rt.spawn(async move {
            let _pending = pending;
            undo.await;
        });
        true
    }

    /// How many tasks have not ended yet.
    pub(crate) fn pending(&self) -> usize {
        self.0.pending.load(Ordering::Acquire)
    }

    /// Waits until no task is pending, or until `deadline`; true when none is.
    async fn settled(&self, deadline: Instant) -> bool {
        loop {
            let idle = self.0.idle.notified();
            tokio::pin!(idle);
            // Registered before the count is read, so the last task's wake-up cannot slip
            // in between.
            idle.as_mut().enable();
            if self.pending() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.pending() == 0;
            }
        }
    }
}

/// The first pause before a failed background release is tried again; it doubles up to
/// [`RETRY_PAUSE_MAX`].
const RETRY_PAUSE: Duration = Duration::from_millis(50);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);

impl Inner {
    /// Gives a remote hold back in the background (cancelled acquisitions, stale holds),
    /// trying again after a transient failure for up to the registry's lease.
    pub(crate) fn release_in_background(&self, name: LockName, token: Token) {
        let until = Instant::now()
            .checked_add(self.opts.lease())
            .unwrap_or_else(Instant::now);
        self.release_retrying(name, token, until);
    }

    /// Gives a remote hold back in the background, trying again after each transient failure
    /// ([`Error::Unavailable`]: a server restarting, a connection reset) until `until`, when
    /// the server lets the lease go by itself. Without the retries, a release that met a
    /// server's restart would leave the key held by nobody for the rest of the lease. A
    /// release is owner-checked, so one that arrives late frees nothing of anybody else's.
    pub(crate) fn release_retrying(&self, name: LockName, token: Token, until: Instant) {
        let backend = self.backend.clone();
        self.background.spawn(async move {
            let mut pause = RETRY_PAUSE;
            loop {
                match backend.release(&name, token).await {
                    Ok(_) => return,
                    Err(e @ Error::Unavailable { .. }) if Instant::now() + pause < until => {
                        tracing::debug!(lock = ?name, error = %e, "release failed; trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(RETRY_PAUSE_MAX);
                    }
                    Err(e) => {
                        tracing::debug!(lock = ?name, error = %e, "background release failed; the lease will expire");
                        return;
                    }
                }
            }
        });
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Never waits here: a drop may run on a runtime thread, and the tasks need no registry.
        let pending = self.background.pending();
        if pending > 0 {
            tracing::debug!(
                pending,
                "registry dropped with background releases still running; LockRegistry::flush waits for them"
            );
        }
    }
}

impl LockRegistry {
    /// Waits, at most `timeout`, until the releases and queue exits this registry left to
    /// background tasks have reached the backend: those of guards dropped without
    /// [`LockGuard::release`](crate::LockGuard::release), and the undo of acquisitions that
    /// were cancelled or timed out (an attempt still in flight is first awaited, then its
    /// token released and its wait-queue entry given back). Tasks started while it waits are
    /// waited for too. Returns true when none is left.
    ///
    /// Call it before the runtime ends (returning from `main`, after a signal, at the end of a
    /// server's graceful shutdown): a runtime that shuts down drops its tasks unfinished, and
    /// what they were to give back then stays held, or queued, until its lease runs out.
    ///
    /// It does not close the registry: acquisitions and renewals go on, and work started
    /// after it returns is not waited for. It releases no hold that a live guard has (release
    /// or drop those first), and it cannot undo what a backend request outside its deadline
    /// left behind: that lease expires as usual. Tasks run on the runtime that started them,
    /// so that runtime must keep running while this waits.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits. Dropping it leaves the tasks running on their runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// use std::time::Duration;
    /// use distlock::{LockRegistry, backends::memory::MemoryBackend};
    /// let registry = LockRegistry::new(MemoryBackend::new());
    /// let guard = registry.obtain("report")?.lock().await?;
    /// drop(guard); // released by a background task
    /// assert!(registry.flush(Duration::from_secs(5)).await);
    /// assert!(registry.obtain("report")?.inspect().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + crate::MAX_LEASE);
        self.inner.background.settled(deadline).await
    }
}
