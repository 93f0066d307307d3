//! What a backend is and what it can promise: [`Capabilities`] and its [`Fencing`] guarantee.

use super::LockKind;
#[cfg(doc)]
use super::{AcquireMode, Backend};

/// How far a backend's fencing tokens can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// Fences strictly increase per key for as long as the backend keeps its data.
    Monotonic,
    /// Fences strictly increase per key even across a restart of the backend that lost its data
    /// (for instance because they are derived from the server's clock).
    MonotonicAcrossDataLoss,
    /// The backend cannot issue trustworthy fences; [`LockGuard::fence`](crate::LockGuard::fence)
    /// is still returned but must not be used to fence writes.
    None,
}

/// What a backend is and what it can promise. The registry and the conformance suite consult
/// it, so each field must be accurate: a backend never claims more than it does.
///
/// Built from [`Capabilities::new`] (a plain compare-and-set store across processes, without
/// notifications or queue) and const setters, so that a backend states only what differs:
///
/// ```
/// use distlock::{Capabilities, Fencing};
/// const CAPS: Capabilities = Capabilities::new("redis")
///     .fencing(Fencing::MonotonicAcrossDataLoss)
///     .notifies_release(true)
///     .fifo(true);
/// assert!(CAPS.fifo && CAPS.cross_process);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// A short name for errors, logs and metric labels: `memory`, `redis`, `sqlite`, ...
    /// ([`Backend::kind`] returns it).
    pub kind: &'static str,
    /// Fencing guarantee. The conformance suite selects its fencing scenarios on it: a backend
    /// with [`Fencing::None`] skips them (and its guards' fences must not fence writes).
    pub fencing: Fencing,
    /// Waiters are woken by a release notification through [`Backend::subscribe`]. The registry
    /// subscribes only when this is true; otherwise its waiters poll.
    pub notifies_release: bool,
    /// The backend keeps a fair wait queue: waiters that attempt with [`AcquireMode::Queue`]
    /// are served in arrival order among themselves. The registry attempts with
    /// [`AcquireMode::Queue`] (and gives its place back with [`Backend::leave_queue`]) only
    /// when this is true. The queue does not bind [`AcquireMode::Try`] attempts, foreign
    /// clients of the same layout, or the local handoffs of one registry.
    pub fifo: bool,
    /// Locks exclude other processes (false only for `memory`).
    pub cross_process: bool,
    /// The backend takes [`LockKind::Read`] and [`LockKind::Write`] holds (read-write locks).
    /// Such a backend also honours [`AcquireMode::Queue`] on an exclusive attempt (mutex or
    /// write) even without a fair queue: while such a writer waits, new read holds are
    /// refused, so that a stream of readers cannot starve it.
    pub read_write: bool,
    /// The backend takes [`LockKind::Semaphore`] holds.
    pub semaphores: bool,
    /// The backend stores each hold's [`Owner`](super::Owner) and reports it in
    /// [`LockInfo::owners`](super::LockInfo::owners).
    pub owners: bool,
    /// The longest lock name the backend's layout stores, in characters: the key, plus the
    /// prefix and one separator where the layout writes the prefix into the name. Keys that
    /// do not fit are refused with [`Error::InvalidKey`](crate::Error). [`MAX_KEY_LEN`](crate::MAX_KEY_LEN)
    /// (no limit of the backend's own) for every backend but ShedLock's SQL table (64).
    pub max_key_len: usize,
}

impl Capabilities {
    /// The backend named `kind` as a plain compare-and-set store: [`Fencing::Monotonic`],
    /// across processes, no release notifications, no wait queue.
    pub const fn new(kind: &'static str) -> Self {
        Capabilities {
            kind,
            fencing: Fencing::Monotonic,
            notifies_release: false,
            fifo: false,
            cross_process: true,
            read_write: false,
            semaphores: false,
            owners: false,
            max_key_len: crate::backend::MAX_KEY_LEN,
        }
    }

    /// Sets the `max_key_len` field.
    #[must_use]
    pub const fn max_key_len(mut self, len: usize) -> Self {
        self.max_key_len = len;
        self
    }

    /// Sets the `fencing` field.
    #[must_use]
    pub const fn fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets the `notifies_release` field.
    #[must_use]
    pub const fn notifies_release(mut self, notifies: bool) -> Self {
        self.notifies_release = notifies;
        self
    }

    /// Sets the `fifo` field.
    #[must_use]
    pub const fn fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// Sets the `cross_process` field.
    #[must_use]
    pub const fn cross_process(mut self, cross_process: bool) -> Self {
        self.cross_process = cross_process;
        self
    }

    /// Sets the `read_write` field.
    #[must_use]
    pub const fn read_write(mut self, read_write: bool) -> Self {
        self.read_write = read_write;
        self
    }

    /// Sets the `semaphores` field.
    #[must_use]
    pub const fn semaphores(mut self, semaphores: bool) -> Self {
        self.semaphores = semaphores;
        self
    }

    /// Sets the `owners` field.
    #[must_use]
    pub const fn owners(mut self, owners: bool) -> Self {
        self.owners = owners;
        self
    }

    /// Sets `read_write` and `semaphores`: the backend takes every [`LockKind`].
    #[must_use]
    pub const fn all_kinds(self) -> Self {
        self.read_write(true).semaphores(true)
    }

    /// Whether the backend takes holds of `kind`.
    pub fn supports(&self, kind: LockKind) -> bool {
        match kind {
            LockKind::Mutex => true,
            LockKind::Read | LockKind::Write => self.read_write,
            LockKind::Semaphore { .. } => self.semaphores,
        }
    }

    /// Whether the backend's fences may be used to fence writes (anything but
    /// [`Fencing::None`]).
    pub fn fences(&self) -> bool {
        !matches!(self.fencing, Fencing::None)
    }
}
