//! The one error type of the crate.

use std::time::Duration;

/// Result alias used throughout distlock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when taking, holding or giving back a lock.
///
/// The variants are semantic: match on them to decide what to do. Whether an error is worth
/// retrying is answered by [`Error::is_retryable`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key is empty, longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes, or otherwise unusable.
    #[error("invalid lock key: {0}")]
    InvalidKey(String),
    /// An option, duration or URL is out of range or malformed. The message names the part.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The lock was not acquired within the allowed time (zero for `try_lock`).
    #[error("lock {key:?} not acquired within {waited:?}")]
    NotAcquired {
        /// The key that stayed busy.
        key: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// The lock was lost while held: its lease ran out, or someone deleted it underneath.
    /// Every later operation on the same guard returns this error again.
    #[error("lock {key:?} was lost while held")]
    LockLost {
        /// The key that was lost.
        key: String,
    },
    /// The caller tried to release or extend a lock that it does not hold.
    #[error("lock {key:?} is not held by this owner")]
    NotHeld {
        /// The key.
        key: String,
    },
    /// The backend could not be reached or answered with a transient failure; retrying may help.
    #[error("{backend} unavailable: {message}")]
    Unavailable {
        /// The backend kind, such as `redis` or `sqlite`.
        backend: &'static str,
        /// What failed, without secrets.
        message: String,
    },
    /// The backend refused the operation for a reason that retrying will not fix
    /// (wrong password, missing permission, a value it cannot parse).
    #[error("{backend} error: {message}")]
    Backend {
        /// The backend kind.
        backend: &'static str,
        /// What failed, without secrets.
        message: String,
    },
    /// The backend cannot do what was asked (see [`Capabilities`](crate::Capabilities)).
    #[error("unsupported by {backend}: {what}")]
    Unsupported {
        /// The backend kind.
        backend: &'static str,
        /// What is missing.
        what: String,
    },
}

impl Error {
    /// True for errors that may go away when the same call is made again later
    /// ([`Error::Unavailable`] and [`Error::NotAcquired`]).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::NotAcquired { .. })
    }

    #[cfg_attr(
        not(any(
            feature = "redis",
            feature = "sqlite",
            feature = "postgres",
            feature = "mysql",
            feature = "zookeeper",
            feature = "etcd"
        )),
        allow(dead_code)
    )]
    pub(crate) fn unavailable(backend: &'static str, message: impl Into<String>) -> Self {
        Error::Unavailable {
            backend,
            message: message.into(),
        }
    }

    pub(crate) fn backend(backend: &'static str, message: impl Into<String>) -> Self {
        Error::Backend {
            backend,
            message: message.into(),
        }
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Error::InvalidConfig(message.into())
    }
}
