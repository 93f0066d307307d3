//! Which backend to use, and the registry over it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use distlock::{LockRegistry, RegistryOptions};

/// Exit status for usage errors.
pub const EXIT_USAGE: i32 = 2;
/// Exit status for backend errors.
pub const EXIT_BACKEND: i32 = 1;
/// Exit status when the lock was not acquired.
pub const EXIT_NOT_ACQUIRED: i32 = 75;
/// Exit status when the lock was lost while held.
pub const EXIT_LOST: i32 = 76;

/// A failure that ends the program: its exit status and a one-line reason.
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
}

impl From<distlock::Error> for Failure {
    fn from(e: distlock::Error) -> Self {
        Failure {
            code: exit_code(&e),
            message: e.to_string(),
        }
    }
}

/// The exit status that stands for a library error.
pub fn exit_code(e: &distlock::Error) -> i32 {
    use distlock::Error;
    match e {
        Error::InvalidKey(_) | Error::InvalidConfig(_) => EXIT_USAGE,
        Error::NotAcquired { .. } => EXIT_NOT_ACQUIRED,
        Error::LockLost { .. } => EXIT_LOST,
        _ => EXIT_BACKEND,
    }
}

/// `--owner`: a holder description, checked by the library's rules (a clap value parser).
pub fn parse_owner(text: &str) -> Result<distlock::Owner, String> {
    distlock::Owner::new(text).map_err(|e| e.to_string())
}

/// The options shared by every command.
#[derive(Debug, Clone)]
pub struct Global {
    /// `--backend` or `DISTLOCK_BACKEND` (clap applies the precedence).
    pub backend: Option<String>,
    pub prefix: String,
}

impl Global {
    /// The backend URL: the explicit one, else the embedded SQLite default.
    pub fn backend_url(&self) -> Result<String, Failure> {
        match self.backend.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => Ok(url.to_owned()),
            _ => default_url(),
        }
    }

    /// Registry options for this invocation, checked without touching the backend.
    pub fn options(&self) -> Result<RegistryOptions, Failure> {
        let options = RegistryOptions::default().with_prefix(self.prefix.clone());
        // Let the library judge the options (prefix rules) before any connection is made, so
        // that a usage error is reported as such even when the backend is down.
        let probe = Arc::new(distlock::backends::memory::MemoryBackend::new());
        LockRegistry::from_backend(probe, options.clone())?;
        Ok(options)
    }

    /// For the commands that only look (`status`, `list`, `unlock`): `None` when the backend is
    /// the default SQLite file and it does not exist yet, so that looking creates neither the
    /// directory nor the database; every lock of a database that does not exist is free.
    pub async fn registry_if_any(&self) -> Result<Option<LockRegistry>, Failure> {
        if matches!(self.backend.as_deref().map(str::trim), Some(url) if !url.is_empty()) {
            return self.registry().await.map(Some);
        }
        self.options()?;
        if !default_path()?.exists() {
            tracing::debug!("no database yet: nothing is held");
            return Ok(None);
        }
        self.registry().await.map(Some)
    }

    /// Connects to the backend and builds a registry.
    pub async fn registry(&self) -> Result<LockRegistry, Failure> {
        let options = self.options()?;
        let url = self.backend_url()?;
        tracing::debug!(backend = %distlock::redact(&url), prefix = %self.prefix, "connecting");
        LockRegistry::connect(&url, options).await.map_err(|e| {
            let mut failure = Failure::from(e);
            if failure.code == EXIT_BACKEND {
                failure.message =
                    format!("{} (backend {})", failure.message, distlock::redact(&url));
            }
            failure
        })
    }
}

/// Checks a key the way every backend does (a clap value parser).
pub fn parse_key(key: &str) -> Result<String, String> {
    distlock::validate_key(key).map_err(|e| e.to_string())?;
    Ok(key.to_owned())
}

/// The backend kind of the default URL, for what the looking commands print without one.
pub const DEFAULT_KIND: &str = "sqlite";

/// `sqlite:///<data dir>/distlock.db`, creating the directory.
fn default_url() -> Result<String, Failure> {
    let db = default_path()?;
    if let Some(dir) = db.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Failure {
            code: EXIT_BACKEND,
            message: format!("cannot create the data directory {}: {e}", dir.display()),
        })?;
    }
    Ok(sqlite_url(&db))
}

/// `<data dir>/distlock.db`, as an absolute path; creates nothing.
fn default_path() -> Result<PathBuf, Failure> {
    let dir = data_dir(
        std::env::var_os("DISTLOCK_HOME"),
        std::env::var_os("XDG_DATA_HOME"),
        std::env::var_os("HOME"),
    )
    .ok_or_else(|| {
        Failure::usage(
            "cannot find a data directory for the default SQLite backend: \
             set DISTLOCK_HOME or HOME, or pass --backend",
        )
    })?;
    let dir = if dir.is_absolute() {
        dir
    } else {
        std::env::current_dir()
            .map_err(|e| Failure {
                code: EXIT_BACKEND,
                message: format!("cannot resolve {}: {e}", dir.display()),
            })?
            .join(dir)
    };
    Ok(dir.join("distlock.db"))
}

/// `$DISTLOCK_HOME`, else `$XDG_DATA_HOME/distlock` (only if absolute, as the XDG spec says),
/// else `$HOME/.local/share/distlock`. Empty variables count as unset.
fn data_dir(
    distlock_home: Option<OsString>,
    xdg_data_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(distlock_home) {
        return Some(dir);
    }
    if let Some(dir) = set(xdg_data_home).filter(|d| d.is_absolute()) {
        return Some(dir.join("distlock"));
    }
    set(home).map(|h| h.join(".local").join("share").join("distlock"))
}

/// A `sqlite://` URL for an absolute path, percent-encoding everything but unreserved
/// characters and `/`.
fn sqlite_url(path: &Path) -> String {
    let mut url = String::from("sqlite://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
            url.push(char::from(b));
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn data_dir_precedence() {
        assert_eq!(
            data_dir(os("/d"), os("/x"), os("/h")),
            Some(PathBuf::from("/d"))
        );
        assert_eq!(
            data_dir(os(""), os("/x"), os("/h")),
            Some(PathBuf::from("/x/distlock"))
        );
        assert_eq!(
            data_dir(None, os("relative"), os("/h")),
            Some(PathBuf::from("/h/.local/share/distlock"))
        );
        assert_eq!(
            data_dir(None, None, os("/h")),
            Some(PathBuf::from("/h/.local/share/distlock"))
        );
        assert_eq!(data_dir(None, None, None), None);
        assert_eq!(data_dir(os(""), os(""), os("")), None);
    }

    #[test]
    fn sqlite_urls_are_percent_encoded() {
        assert_eq!(sqlite_url(Path::new("/a/b.db")), "sqlite:///a/b.db");
        assert_eq!(
            sqlite_url(Path::new("/my dir/x?#%.db")),
            "sqlite:///my%20dir/x%3F%23%25.db"
        );
    }

    #[test]
    fn error_exit_codes() {
        use distlock::Error;
        assert_eq!(exit_code(&Error::InvalidKey("k".into())), 2);
        assert_eq!(exit_code(&Error::InvalidConfig("c".into())), 2);
        let busy = Error::NotAcquired {
            key: "k".into(),
            waited: std::time::Duration::ZERO,
        };
        assert_eq!(exit_code(&busy), 75);
        assert_eq!(exit_code(&Error::LockLost { key: "k".into() }), 76);
        let down = Error::Unavailable {
            backend: "redis",
            message: "down".into(),
        };
        assert_eq!(exit_code(&down), 1);
        let unsupported = Error::Unsupported {
            backend: "url",
            what: "zk".into(),
        };
        assert_eq!(exit_code(&unsupported), 1);
    }

    #[test]
    fn keys_are_checked() {
        assert!(parse_key("voucher:42").is_ok());
        assert!(parse_key("").is_err());
        assert!(parse_key(&"k".repeat(1025)).is_err());
        assert!(parse_key(&"k".repeat(1024)).is_ok());
    }
}
