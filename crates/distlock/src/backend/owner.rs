//! Who holds a lock: [`Owner`], the short description every hold carries.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The longest [`Owner`] description, in bytes.
pub const MAX_OWNER_LEN: usize = 128;

/// What [`LockInfo::owners`](super::LockInfo::owners) says of a holder whose layout records
/// no description (a foreign client, or a hold taken before descriptions were recorded).
pub const UNKNOWN_OWNER: &str = "unknown";

/// A short description of who holds a lock, for people: `status`, `list`, the page and the
/// leader of an election show it. Every hold carries one; the registry's is
/// [`Owner::this_process`] (`<hostname>:<pid>`) unless
/// [`RegistryOptions::with_owner`](crate::RegistryOptions::with_owner) or
/// [`Lock::with_owner`](crate::Lock::with_owner) names another.
///
/// It is shown to whoever may list the locks, so it must never be a secret: at most
/// [`MAX_OWNER_LEN`] bytes, printable, and no URL (nothing with `://`). It identifies nobody
/// to the server either: owner checks use the hold's token, never this.
///
/// ```
/// use distlock::Owner;
/// let owner = Owner::new("billing-7f9c:4312").unwrap();
/// assert_eq!(owner.as_str(), "billing-7f9c:4312");
/// assert!(Owner::new("redis://:secret@db:6379").is_err());
/// assert!(Owner::new("").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// A description, checked: empty, longer than [`MAX_OWNER_LEN`] bytes, holding a control
    /// character or looking like a URL is [`Error::InvalidConfig`].
    pub fn new(description: impl AsRef<str>) -> Result<Self> {
        let d = description.as_ref();
        if d.trim().is_empty() {
            return Err(Error::InvalidConfig("an owner description is empty".into()));
        }
        if d.len() > MAX_OWNER_LEN {
            return Err(Error::InvalidConfig(format!(
                "an owner description is {} bytes, more than {MAX_OWNER_LEN}",
                d.len()
            )));
        }
        if d.chars().any(char::is_control) {
            return Err(Error::InvalidConfig(
                "an owner description holds a control character".into(),
            ));
        }
        if d.contains("://") {
            return Err(Error::InvalidConfig(
                "an owner description looks like a URL; it is shown to anyone who lists locks, so it must not carry one".into(),
            ));
        }
        Ok(Owner(d.into()))
    }

    /// `<hostname>:<pid>` of this process (`localhost` where the host has no name).
    pub fn this_process() -> Self {
        let host = hostname().unwrap_or_else(|| "localhost".into());
        let pid = std::process::id();
        let mut d = format!("{host}:{pid}");
        if d.len() > MAX_OWNER_LEN || d.chars().any(char::is_control) || d.contains("://") {
            d = format!("pid:{pid}");
        }
        Owner(d.into())
    }

    /// The description.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A description read back from a server, where anything may have been written: cut to
    /// [`MAX_OWNER_LEN`] bytes with its control characters replaced, [`UNKNOWN_OWNER`] when
    /// nothing is left. Backends use it for what their layout stores.
    pub fn shown(stored: &[u8]) -> String {
        let text = String::from_utf8_lossy(stored);
        let mut out = String::new();
        for c in text.chars() {
            if out.len() + c.len_utf8() > MAX_OWNER_LEN {
                break;
            }
            out.push(if c.is_control() { ' ' } else { c });
        }
        let out = out.trim().to_string();
        if out.is_empty() {
            UNKNOWN_OWNER.into()
        } else {
            out
        }
    }
}

impl Default for Owner {
    fn default() -> Self {
        Owner::this_process()
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(unix)]
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

#[cfg(not(unix))]
fn hostname() -> Option<String> {
    std::env::var("COMPUTERNAME").ok().filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_are_checked() {
        assert!(Owner::new("web-1:77").is_ok());
        assert!(Owner::new("   ").is_err());
        assert!(Owner::new("a\nb").is_err());
        assert!(Owner::new("x".repeat(MAX_OWNER_LEN + 1)).is_err());
        assert!(Owner::new("x".repeat(MAX_OWNER_LEN)).is_ok());
        assert!(Owner::new("postgres://u:p@h/db").is_err());
    }

    #[test]
    fn this_process_names_the_pid() {
        let owner = Owner::this_process();
        assert!(
            owner
                .as_str()
                .ends_with(&format!(":{}", std::process::id())),
            "{owner}"
        );
        assert!(Owner::new(owner.as_str()).is_ok());
    }

    #[test]
    fn stored_text_is_made_safe_to_show() {
        assert_eq!(Owner::shown(b""), UNKNOWN_OWNER);
        assert_eq!(Owner::shown(b"a\x07b"), "a b");
        assert_eq!(Owner::shown(&[b'y'; 400]).len(), MAX_OWNER_LEN);
        assert_eq!(Owner::shown(b"host:1"), "host:1");
    }
}
