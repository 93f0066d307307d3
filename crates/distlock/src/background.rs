//! Undo work the registry leaves to background tasks (a release on drop, giving back an
//! abandoned attempt's token, leaving a wait queue), counted so that a process can wait for it
//! before its runtime ends ([`LockRegistry::flush`](crate::LockRegistry::flush)). A runtime
//! that shuts down drops its tasks unfinished: without the wait, what they were to give back
//! stays held or queued on the server until its lease runs out. The releases themselves are
//! `Inner`'s (`state.rs`).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

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
    pub(crate) async fn settled(&self, deadline: Instant) -> bool {
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
