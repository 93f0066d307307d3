//! What one acquisition attempt asks of a backend: [`AcquireRequest`] and its [`AcquireMode`].

use std::time::Duration;

#[cfg(doc)]
use super::{Attempt, Backend, Capabilities};
use super::{LockName, Owner, Token};

/// How an acquisition attempt treats a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcquireMode {
    /// A caller that will not wait: take the lock if it is free, else report it busy and leave
    /// no trace on the server.
    Try,
    /// A caller that will wait if the lock is busy. A backend with a fair wait queue
    /// ([`Capabilities::fifo`]) enqueues the token (or refreshes its place) when busy and lets
    /// only the head of the queue take a free lock; the caller gives its place back with
    /// [`Backend::leave_queue`] when it stops waiting. Backends without a queue treat it as
    /// [`AcquireMode::Try`].
    Queue,
}

/// One acquisition attempt, as the registry asks a backend for it ([`Backend::acquire`]).
///
/// A request rather than an argument list, so that what an attempt carries can grow (the kind
/// of hold: shared or exclusive, a number of permits) without changing every backend's
/// signature; fields are added, never removed, hence `#[non_exhaustive]`: build it with
/// [`AcquireRequest::new`] and the `with_*` setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The lock.
    pub name: LockName,
    /// The owner token of this acquisition; the registry repeats it on a retry.
    pub token: Token,
    /// The lease, counted from when the server applies the attempt.
    pub lease: Duration,
    /// What a busy lock means for this attempt.
    pub mode: AcquireMode,
    /// Who asks: a backend that records owners ([`Capabilities::owners`]) stores it with the
    /// hold, where [`Backend::inspect`] and [`Backend::list`] read it back.
    pub owner: Option<Owner>,
    /// On an [`AcquireMode::Try`] attempt: the caller waits if it finds the lock busy, and its
    /// next attempt, in [`AcquireMode::Queue`], follows at once. A backend that knows without
    /// asking that the lock is somebody else's now (its own last release of it handed it to a
    /// queued waiter) may then answer [`Attempt::Busy`] with no I/O: the queued attempt that
    /// follows asks the server, and the caller saves a round trip. False unless set.
    pub waits: bool,
}

impl AcquireRequest {
    /// An [`AcquireMode::Try`] attempt on `name` for `token` with `lease`.
    pub fn new(name: LockName, token: Token, lease: Duration) -> Self {
        AcquireRequest {
            name,
            token,
            lease,
            mode: AcquireMode::Try,
            owner: None,
            waits: false,
        }
    }

    /// Sets [`owner`](Self::owner).
    #[must_use]
    pub fn with_owner(mut self, owner: Owner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The owner's description as a backend stores it: [`UNKNOWN_OWNER`](super::UNKNOWN_OWNER)
    /// when the request names none.
    pub fn owner_str(&self) -> &str {
        self.owner
            .as_ref()
            .map_or(super::UNKNOWN_OWNER, Owner::as_str)
    }

    /// Sets [`mode`](Self::mode).
    #[must_use]
    pub fn with_mode(mut self, mode: AcquireMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets [`waits`](Self::waits).
    #[must_use]
    pub fn with_waits(mut self, waits: bool) -> Self {
        self.waits = waits;
        self
    }

    /// Whether the attempt joins the backend's wait queue when busy ([`AcquireMode::Queue`]).
    pub fn queued(&self) -> bool {
        self.mode == AcquireMode::Queue
    }
}
