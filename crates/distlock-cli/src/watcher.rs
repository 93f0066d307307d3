//! The watcher: a tiny process that kills CMD's process group when `distlock` dies.
//!
//! `distlock run` starts it (by re-executing its own binary with [`WATCH_ARG`]) before CMD.
//! Its stdin is the read end of a pipe whose write end only `distlock` holds: the fd is
//! close-on-exec everywhere else, so CMD never inherits it. Before CMD's program is executed,
//! CMD's child process writes its pid (= its process group, see [`crate::group`]) into the
//! pipe, so the watcher knows the group before any of CMD's code runs.
//!
//! * `distlock` ends normally: it writes [`QUIT`] once CMD's group is gone; the watcher exits.
//! * `distlock` dies any other way (SIGKILL, the OOM killer, a crash): the kernel closes the
//!   write end, the watcher reads end-of-file and kills the whole group with SIGKILL.
//! * The group is gone by itself: the watcher notices (it looks every [`LOOK_EVERY_MS`]) and
//!   exits quietly.
//!
//! The watcher lives in a process group of its own, so a terminal's Ctrl-C or a signal to
//! `distlock`'s group does not end it before it has done its work. It never writes anything.

use std::os::fd::{AsFd, BorrowedFd};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{read, Pid};

/// The hidden first argument that turns `distlock` into the watcher.
pub const WATCH_ARG: &str = "__distlock-watch-group";
/// What `distlock` writes when CMD's group is gone and nothing must be killed.
pub const QUIT: u8 = b'Q';
/// How often the watcher checks that the group still exists.
const LOOK_EVERY_MS: u16 = 500;

/// Runs the watcher on stdin; returns its exit status.
pub fn main() -> i32 {
    let stdin = std::io::stdin();
    watch(stdin.as_fd())
}

/// What the pipe said.
enum Heard {
    /// Bytes (the pid's, or [`QUIT`]).
    Bytes(Vec<u8>),
    /// End of file: every write end is closed.
    Eof,
    /// Nothing within the timeout.
    Nothing,
}

fn listen(fd: BorrowedFd<'_>, timeout_ms: Option<u16>) -> Heard {
    let timeout = timeout_ms.map_or(PollTimeout::NONE, PollTimeout::from);
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, timeout) {
        Ok(0) => return Heard::Nothing,
        Ok(_) => {}
        Err(Errno::EINTR) => return Heard::Nothing,
        Err(_) => return Heard::Eof,
    }
    let mut buf = [0u8; 64];
    loop {
        match read(fd, &mut buf) {
            Ok(0) => return Heard::Eof,
            Ok(n) => return Heard::Bytes(buf[..n].to_vec()),
            Err(Errno::EINTR) => continue,
            Err(_) => return Heard::Eof,
        }
    }
}

fn group_exists(pgid: Pid) -> bool {
    // EPERM means it exists (and is not ours to signal, which cannot happen for CMD's group).
    !matches!(killpg(pgid, None), Err(Errno::ESRCH))
}

fn watch(fd: BorrowedFd<'_>) -> i32 {
    // First the group: CMD's child writes its pid (4 bytes, native order) before it executes.
    let mut got: Vec<u8> = Vec::new();
    while got.len() < 4 {
        match listen(fd, None) {
            Heard::Bytes(b) => got.extend(b),
            // distlock ended before CMD started, or CMD's exec failed: nothing to guard.
            Heard::Eof => return 0,
            Heard::Nothing => {}
        }
    }
    let pid = i32::from_ne_bytes([got[0], got[1], got[2], got[3]]);
    if pid <= 1 {
        return 0;
    }
    let pgid = Pid::from_raw(pid);
    if got[4..].contains(&QUIT) {
        return 0;
    }
    loop {
        match listen(fd, Some(LOOK_EVERY_MS)) {
            Heard::Bytes(b) if b.contains(&QUIT) => return 0,
            Heard::Bytes(_) | Heard::Nothing => {
                if !group_exists(pgid) {
                    return 0;
                }
            }
            Heard::Eof => {
                // distlock is gone without saying so: CMD must not run on unsupervised.
                let _ = killpg(pgid, Signal::SIGKILL);
                return 0;
            }
        }
    }
}
