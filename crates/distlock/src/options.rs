//! [`RegistryOptions`]: how a registry behaves, its setters and getters, and their validation;
//! the lease bounds every lock accepts.

use std::time::Duration;

use crate::backend::{Owner, Token};
use crate::error::{Error, Result};
use crate::renewal::LOCAL_SEQ_BITS;

/// Shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Longest lease accepted.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// How a [`LockRegistry`](crate::LockRegistry) behaves. Build with
/// [`RegistryOptions::default`] and the `with_*` setters; the getters carry the plain names.
///
/// ```
/// use std::time::Duration;
/// use distlock::RegistryOptions;
/// let opts = RegistryOptions::default()
///     .with_prefix("billing")
///     .with_lease(Duration::from_secs(10));
/// assert_eq!(opts.prefix(), "billing");
/// assert_eq!(opts.lease(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    pub(crate) prefix: String,
    pub(crate) lease: Duration,
    pub(crate) lease_explicit: bool,
    pub(crate) renew: bool,
    pub(crate) max_local_handoffs: u32,
    pub(crate) max_cached_locks: usize,
    pub(crate) max_poll_interval: Option<Duration>,
    pub(crate) contended_release_grace: Duration,
    pub(crate) client_id: String,
    pub(crate) owner: Owner,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            prefix: "lock".into(),
            lease: Duration::from_secs(30),
            lease_explicit: false,
            renew: true,
            max_local_handoffs: 32,
            max_cached_locks: 10_000,
            max_poll_interval: None,
            contended_release_grace: Duration::from_millis(20),
            client_id: Token::random().to_string(),
            owner: Owner::this_process(),
        }
    }
}

impl RegistryOptions {
    /// Namespace of every key (default `lock`; Redis keys are `<prefix>:<key>`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
    /// Default lease of a remote hold (default 30 s, or the backend's
    /// [`longest_lease`](crate::Backend::longest_lease) when that is shorter); a
    /// [`Lock`](crate::Lock) may override it. A lease set here is kept as it is, and one the
    /// backend cannot grant fails.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.lease_explicit = true;
        self
    }
    /// Renew leases while guards live (default true). Without renewal a hold ends with its lease.
    pub fn with_renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }
    /// How many times in a row a remote hold may pass straight to a local waiter before it is
    /// released remotely so that other processes get their turn (default 32, at most 1023).
    pub fn with_max_local_handoffs(mut self, n: u32) -> Self {
        self.max_local_handoffs = n;
        self
    }
    /// Bound of the handle cache (default 10 000). Held locks are never evicted; idle handles
    /// are, oldest first, when the bound is reached.
    pub fn with_max_cached_locks(mut self, n: usize) -> Self {
        self.max_cached_locks = n;
        self
    }
    /// Longest pause between two attempts of a waiter that has not been notified. Default:
    /// 500 ms on backends that notify releases (polling only catches expiry there), 50 ms on
    /// the others. A waiter deep in a queue whose backend wakes each waiter in its turn
    /// (ZooKeeper, etcd, Redis: `Attempt::Busy::ahead`) polls less often, by its place:
    /// with `n` contenders before it, up to `n - 1` times this (at most 120 times), so that
    /// many waiters do not poll the server in a herd. The head and the waiter behind it, and a
    /// waiter whose holder's lease ends sooner, keep this pace; a ranked waiter that cannot be
    /// woken (its subscription failed) looks sooner when its turn is near (every 2–32 ms once
    /// next in line). On MySQL/MariaDB a waiter whose process's doorbell listener stands in
    /// the lock's turnstile line polls at 3 times this.
    pub fn with_max_poll_interval(mut self, d: Duration) -> Self {
        self.max_poll_interval = Some(d);
        self
    }
    /// After releasing a lock that others were waiting for (as far as the backend reports it
    /// through [`Released::contended`](crate::Released)), how long this registry lets them go
    /// first before contending for it again (default 20 ms; it ends at the next release
    /// notification). Zero allows barging. Backends with a fair wait queue (Redis) need none.
    pub fn with_contended_release_grace(mut self, d: Duration) -> Self {
        self.contended_release_grace = d;
        self
    }
    /// Identifies this registry in logs (default random): every acquisition, extension and
    /// release span carries it as its `client` field, so the holds of one service can be told
    /// apart from another's in traces.
    pub fn with_client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }
    /// The namespace of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The default lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// Whether the lease was set with [`with_lease`](Self::with_lease).
    pub fn lease_is_explicit(&self) -> bool {
        self.lease_explicit
    }
    /// Whether leases are renewed while guards live.
    pub fn renew(&self) -> bool {
        self.renew
    }
    /// The bound on consecutive local handoffs of one remote hold.
    pub fn max_local_handoffs(&self) -> u32 {
        self.max_local_handoffs
    }
    /// The bound of the handle cache.
    pub fn max_cached_locks(&self) -> usize {
        self.max_cached_locks
    }
    /// The longest pause between two polls of a waiter, when set (else the backend's default).
    pub fn max_poll_interval(&self) -> Option<Duration> {
        self.max_poll_interval
    }
    /// How long a releasing registry lets remote waiters go first.
    pub fn contended_release_grace(&self) -> Duration {
        self.contended_release_grace
    }
    /// This registry's identity in logs: the `client` field of its tracing spans.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Who this registry's holds say they are (default [`Owner::this_process`],
    /// `<hostname>:<pid>`): `status`, `list` and an election's `leader` show it. A
    /// [`Lock`](crate::Lock) may name another with [`Lock::with_owner`](crate::Lock::with_owner).
    pub fn with_owner(mut self, owner: Owner) -> Self {
        self.owner = owner;
        self
    }

    /// See [`with_owner`](Self::with_owner).
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    pub(crate) fn validate(&self) -> Result<()> {
        check_lease(self.lease)?;
        if self.prefix.is_empty() || self.prefix.len() > 256 || self.prefix.contains('\0') {
            return Err(Error::config(
                "the prefix must be 1 to 256 bytes without NUL",
            ));
        }
        if self.max_local_handoffs >= 1 << LOCAL_SEQ_BITS {
            return Err(Error::config(format!(
                "max_local_handoffs must be below {}",
                1 << LOCAL_SEQ_BITS
            )));
        }
        if self.max_cached_locks == 0 {
            return Err(Error::config("max_cached_locks must be at least 1"));
        }
        if let Some(p) = self.max_poll_interval {
            if p.is_zero() {
                return Err(Error::config("max_poll_interval must be positive"));
            }
        }
        Ok(())
    }
}

pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(Error::config(format!(
            "lease {lease:?} is outside {MIN_LEASE:?}..={MAX_LEASE:?}"
        )));
    }
    Ok(())
}
