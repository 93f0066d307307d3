//! The one error type of the crate.

use std::fmt;
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
    #[error("lock {} not acquired within {waited:?}", ShortKey(key))]
    NotAcquired {
        /// The key that stayed busy.
        key: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// The lock was lost while held: its lease ran out, or someone deleted it underneath.
    /// Every later operation on the same guard returns this error again.
    #[error("lock {} was lost while held", ShortKey(key))]
    LockLost {
        /// The key that was lost.
        key: String,
    },
    /// The caller tried to release or extend a lock that it does not hold.
    #[error("lock {} is not held by this owner", ShortKey(key))]
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

/// A key as messages show it: quoted as `{:?}` does, or, when it is longer than
/// [`ShortKey::MAX_SHOWN`] characters, its first ones and its length
/// (`"aaaa…" (100000 bytes)`), so that a long key does not make a long error line.
///
/// ```
/// use distlock::ShortKey;
/// assert_eq!(ShortKey("voucher:42").to_string(), r#""voucher:42""#);
/// let long = "k".repeat(5000);
/// assert_eq!(
///     ShortKey(&long).to_string(),
///     format!("\"{}…\" (5000 bytes)", "k".repeat(ShortKey::MAX_SHOWN))
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortKey<'a>(pub &'a str);

impl ShortKey<'_> {
    /// The most characters of a key that a message shows.
    pub const MAX_SHOWN: usize = 40;
}

impl fmt::Display for ShortKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.0;
        match key.char_indices().nth(Self::MAX_SHOWN) {
            None => write!(f, "{key:?}"),
            Some((cut, _)) => {
                let shown = format!("{:?}", &key[..cut]);
                let inner = &shown[..shown.len() - 1];
                write!(f, "{inner}…\" ({} bytes)", key.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_are_shortened_in_messages() {
        let key = "k".repeat(100_000);
        for e in [
            Error::NotAcquired {
                key: key.clone(),
                waited: Duration::ZERO,
            },
            Error::LockLost { key: key.clone() },
            Error::NotHeld { key: key.clone() },
        ] {
            let shown = e.to_string();
            assert!(shown.len() < 120, "{shown}");
            assert!(shown.contains("(100000 bytes)"), "{shown}");
            assert!(shown.contains(&"k".repeat(ShortKey::MAX_SHOWN)), "{shown}");
        }
        let e = Error::LockLost { key: "a\"b".into() };
        assert_eq!(e.to_string(), r#"lock "a\"b" was lost while held"#);
    }

    #[test]
    fn a_short_key_is_cut_at_a_character() {
        let key = "ü".repeat(ShortKey::MAX_SHOWN);
        assert_eq!(ShortKey(&key).to_string(), format!("{key:?}"));
        let longer = format!("{key}ü\n");
        let shown = ShortKey(&longer).to_string();
        assert_eq!(shown, format!("\"{key}…\" ({} bytes)", longer.len()));
    }
}
