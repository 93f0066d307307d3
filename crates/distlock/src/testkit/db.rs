//! Helpers shared by the PostgreSQL and MariaDB test servers: service users, blocking on async
//! client calls from test code, database names and leftover clean-up.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The uid and gid of a system user, such as `postgres`, when it exists.
pub(crate) fn service_user(name: &str) -> Option<(u32, u32)> {
    let cname = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam returns a pointer to static storage or NULL; we copy two integers out
    // at once. Tests that call this may race on that storage only with other getpwnam callers,
    // which the testkit serialises through its callers' start-up.
    unsafe {
        let pw = libc::getpwnam(cname.as_ptr());
        if pw.is_null() {
            None
        } else {
            Some(((*pw).pw_uid, (*pw).pw_gid))
        }
    }
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Hands `path` and everything under it to `uid:gid`.
pub(crate) fn chown_tree(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Runs an async client call to completion from synchronous test code, also from inside a
/// Tokio runtime (on a thread of its own with its own runtime).
pub(crate) fn block_on<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> io::Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|rt| rt.block_on(fut))
    })
    .join()
    .map_err(|_| io::Error::other("the database helper thread panicked"))?
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A database name unique to this process and moment: `distlock_t<secs>_<pid>_<random>`.
pub(crate) fn unique_database_name() -> String {
    format!(
        "distlock_t{}_{}_{:06x}",
        now_secs(),
        std::process::id(),
        rand::random::<u32>() & 0xff_ffff
    )
}

/// Whether a database made by [`unique_database_name`] is a leftover: its process is gone and
/// it is older than ten minutes.
pub(crate) fn is_stale_database(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("distlock_t") else {
        return false;
    };
    let mut parts = rest.split('_');
    let (Some(secs), Some(pid)) = (parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(secs), Ok(pid)) = (secs.parse::<u64>(), pid.parse::<u32>()) else {
        return false;
    };
    now_secs().saturating_sub(secs) > 600 && !Path::new(&format!("/proc/{pid}")).exists()
}

/// The first of `names` found on `PATH` or in `extra` directories.
pub(crate) fn find_binary(names: &[&str], extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = extra
        .iter()
        .cloned()
        .chain(std::env::split_paths(&path))
        .collect();
    for name in names {
        for dir in &dirs {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// Reads a server log for an error message (at most the last 4 KiB).
pub(crate) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(4096);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}
