//! Process helpers shared by the testkit's servers (Redis, etcd, ZooKeeper, PostgreSQL,
//! MariaDB): a server process kept as an `Option<Child>` (`None` once killed), its log file, and
//! the errors that say what to install.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Child, Stdio};

/// Whether the process is alive (it may be stopped by `SIGSTOP`).
pub(crate) fn is_running(child: &mut Option<Child>) -> bool {
    match child {
        Some(child) => matches!(child.try_wait(), Ok(None)),
        None => false,
    }
}

/// Kills the process with `SIGKILL` (which also ends a stopped one) and waits for it, then
/// forgets it. Does nothing if there is none; an error means it had already exited.
pub(crate) fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `Some(status)` once the process has exited (it is then forgotten), `None` while it runs.
pub(crate) fn exit_status(child: &mut Option<Child>) -> Option<String> {
    let status = match child.as_mut().map(Child::try_wait) {
        Some(Ok(None)) => return None,
        Some(Ok(Some(status))) => status.to_string(),
        Some(Err(e)) => e.to_string(),
        None => "not running".to_owned(),
    };
    *child = None;
    Some(status)
}

/// Sends `signal` to the process; `what` names the server in the error when none runs.
pub(crate) fn signal(child: Option<&Child>, what: &str, signal: libc::c_int) -> io::Result<()> {
    let pid = child
        .map(Child::id)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{what} is not running")))?;
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child, which has
    // not been reaped (children are only waited for in `kill`, which also forgets them).
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A server's log file opened for appending: its standard output and error, and the offset
/// its new output starts at (for [`read_log`]).
pub(crate) struct Log {
    pub(crate) stdout: Stdio,
    pub(crate) stderr: Stdio,
    pub(crate) start: u64,
}

/// Opens (creating it if needed) the log file at `path` for a process about to start.
pub(crate) fn open_log(path: &Path) -> io::Result<Log> {
    let log = OpenOptions::new().create(true).append(true).open(path)?;
    let start = log.metadata()?.len();
    Ok(Log {
        stdout: Stdio::from(log.try_clone()?),
        stderr: Stdio::from(log),
        start,
    })
}

/// The log's text from byte `start` on, at most its last 40 lines.
pub(crate) fn read_log(path: &Path, start: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = File::open(path) {
        if file.seek(SeekFrom::Start(start)).is_ok() {
            let _ = file.read_to_string(&mut text);
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Turns a failure to run `binary` into an error that says to install `package` when the
/// binary is missing.
pub(crate) fn spawn_error(binary: &str, package: &str, error: io::Error) -> io::Error {
    if error.kind() == io::ErrorKind::NotFound {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "`{binary}` was not found on PATH: install it with `apt-get install {package}` \
                 (scripts/test.sh installs it); server-backed tests never skip"
            ),
        )
    } else {
        io::Error::new(error.kind(), format!("cannot run `{binary}`: {error}"))
    }
}
