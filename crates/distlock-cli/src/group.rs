//! CMD's process group: started in a group of its own, given the terminal, signalled as a
//! whole, reaped completely, and killed by a watcher process if `distlock` dies.
//!
//! * CMD's child calls `setpgid(0, 0)` before it executes CMD (and `distlock` calls it too, so
//!   whichever runs first wins the race), so the group id is CMD's pid.
//! * When `distlock` is the terminal's foreground job (stdin is its controlling terminal and
//!   its group is the terminal's foreground group), CMD's group becomes the foreground group
//!   before CMD runs, so
//!   CMD can read the terminal and a Ctrl-C reaches CMD's group once (not `distlock`, which
//!   would otherwise forward it a second time). `distlock` ignores SIGTTOU and SIGTTIN while
//!   it holds the group (CMD gets the dispositions `distlock` started with) and takes the
//!   foreground back when CMD ends.
//! * `distlock` is a child subreaper while CMD runs: processes of the group whose parent died
//!   are re-parented to it and reaped by it, so "the group is gone" means that no process of it
//!   exists any more, zombies included.
//! * The watcher (see [`crate::watcher`]) kills the group with SIGKILL if `distlock` dies.
//! * CMD's environment loses [`SCRUBBED_ENV`].

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::{killpg, sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgrp, getpid, pipe2, setpgid, tcgetpgrp, tcsetpgrp, Pid};
use tokio::signal::unix::{signal, SignalKind};

use crate::watcher::{QUIT, WATCH_ARG};

/// Variables `distlock` reads that may hold credentials: CMD never sees them.
pub const SCRUBBED_ENV: &[&str] = &["DISTLOCK_BACKEND"];

/// The controlling terminal on stdin, and what to restore afterwards.
struct Terminal {
    /// Our own process group, which gets the foreground back.
    own: Pid,
    /// SIGTTOU and SIGTTIN as they were before `distlock` ignored them.
    saved: [(Signal, SigAction); 2],
    /// Whether CMD's group got the foreground when it started.
    gave: bool,
    /// CMD has ended: the terminal is no longer handed to its group.
    returned: bool,
}

fn stdin_fd() -> BorrowedFd<'static> {
    // SAFETY: fd 0 stays open for the life of the process (it is never closed by distlock).
    unsafe { BorrowedFd::borrow_raw(0) }
}

/// When stdin is our controlling terminal: our group, and whether it is in the foreground
/// (only then may CMD's group take the foreground: a background job must not steal it).
fn controlling_terminal() -> Option<(Pid, bool)> {
    let fd = stdin_fd();
    if !nix::unistd::isatty(fd).unwrap_or(false) {
        return None;
    }
    let own = getpgrp();
    let foreground = tcgetpgrp(fd).ok()?;
    Some((own, foreground == own))
}

/// Whether `pgrp` is the terminal's foreground group.
fn in_foreground(pgrp: Pid) -> bool {
    tcgetpgrp(stdin_fd()).ok() == Some(pgrp)
}

fn set_disposition(sig: Signal, handler: SigHandler) -> Option<SigAction> {
    let action = SigAction::new(handler, SaFlags::empty(), SigSet::empty());
    // SAFETY: SIG_IGN/SIG_DFL or a disposition saved earlier; no Rust handler is installed.
    unsafe { sigaction(sig, &action) }.ok()
}

/// CMD, running in its own process group.
pub struct Group {
    /// CMD's pid, which is also its process group's id.
    pid: Pid,
    status: Option<ExitStatus>,
    /// CMD was stopped (Ctrl-Z on the terminal) and `distlock` has not followed yet.
    stopped: bool,
    watcher: Option<Watcher>,
    terminal: Option<Terminal>,
    sigchld: tokio::signal::unix::Signal,
}

struct Watcher {
    pid: Pid,
    /// The write end of the watcher's pipe; closing it without [`QUIT`] kills the group.
    pipe: Option<OwnedFd>,
    reaped: bool,
}

/// Why CMD could not be started.
pub struct SpawnError(pub io::Error);

impl Group {
    /// Starts the watcher, then `program args` in a new process group with `env` added and
    /// [`SCRUBBED_ENV`] removed. Must be called within the Tokio runtime.
    pub fn spawn(
        program: &OsStr,
        args: &[OsString],
        env: &[(&str, String)],
    ) -> Result<Group, SpawnError> {
        // Before anything can exit: the SIGCHLD stream must exist to see it.
        let sigchld = signal(SignalKind::child()).map_err(SpawnError)?;
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::debug!(error = %e, "cannot become a child subreaper");
        }
        let (read_end, write_end) = pipe2(OFlag::O_CLOEXEC).map_err(|e| SpawnError(e.into()))?;
        let watcher = spawn_watcher(read_end).map_err(|e| {
            SpawnError(io::Error::other(format!(
                "cannot start the watcher of its process group: {e}"
            )))
        })?;
        let watcher = Watcher {
            pid: watcher,
            pipe: Some(write_end),
            reaped: false,
        };

        let controlling = controlling_terminal();
        let take_terminal = controlling.is_some_and(|(_, foreground)| foreground);
        let terminal = controlling.map(|(own, _)| {
            let ttou = set_disposition(Signal::SIGTTOU, SigHandler::SigIgn);
            let ttin = set_disposition(Signal::SIGTTIN, SigHandler::SigIgn);
            let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
            Terminal {
                own,
                saved: [
                    (Signal::SIGTTOU, ttou.unwrap_or(default)),
                    (Signal::SIGTTIN, ttin.unwrap_or(default)),
                ],
                gave: take_terminal,
                returned: false,
            }
        });
        let saved = terminal.as_ref().map(|t| t.saved);
        let pipe_fd = watcher.pipe.as_ref().map_or(-1, |p| p.as_raw_fd());

        let mut command = std::process::Command::new(program);
        command.args(args);
        for name in SCRUBBED_ENV {
            command.env_remove(name);
        }
        for (name, value) in env {
            command.env(name, value);
        }
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls (setpgid, getpid, tcsetpgrp, sigaction, write).
        unsafe {
            command.pre_exec(move || {
                setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
                let me = getpid();
                if take_terminal {
                    let _ = tcsetpgrp(BorrowedFd::borrow_raw(0), me);
                }
                if let Some(saved) = &saved {
                    for (sig, action) in saved {
                        let _ = sigaction(*sig, action);
                    }
                }
                // Tell the watcher the group before CMD runs; the fd closes at exec.
                if pipe_fd >= 0 {
                    let _ = nix::unistd::write(
                        BorrowedFd::borrow_raw(pipe_fd),
                        &me.as_raw().to_ne_bytes(),
                    );
                }
                Ok(())
            });
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                let mut group = Group {
                    pid: Pid::from_raw(0),
                    status: None,
                    stopped: false,
                    watcher: Some(watcher),
                    terminal,
                    sigchld,
                };
                group.take_terminal_back();
                group.finish();
                return Err(SpawnError(e));
            }
        };
        let pid = Pid::from_raw(child.id() as i32);
        // std's Child neither waits nor kills on drop: the group is reaped by `reap` below.
        drop(child);
        // The child may not have run yet: do what it does, so both orders end the same.
        let _ = setpgid(pid, pid);
        if take_terminal {
            let _ = tcsetpgrp(stdin_fd(), pid);
        }
        tracing::debug!(
            pid = pid.as_raw(),
            watcher = watcher.pid.as_raw(),
            foreground = take_terminal,
            "the command runs in its own process group"
        );
        Ok(Group {
            pid,
            status: None,
            stopped: false,
            watcher: Some(watcher),
            terminal,
            sigchld,
        })
    }

    /// CMD's exit status, once it has ended.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Sends `sig` to every process of CMD's group (nothing once the group is gone).
    pub fn signal(&self, sig: Signal) {
        match killpg(self.pid, sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => {
                tracing::debug!(signal = %sig, error = %e, "cannot signal the command's group")
            }
        }
    }

    /// Reaps every child that has ended: CMD, processes of its group re-parented to us, the
    /// watcher. Gives the terminal back once CMD has ended.
    pub fn reap(&mut self) {
        loop {
            match waitpid(
                None::<Pid>,
                Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED),
            ) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    self.ended(pid, ExitStatus::from_raw((code & 0xff) << 8))
                }
                Ok(WaitStatus::Signaled(pid, sig, core)) => {
                    let raw = sig as i32 | if core { 0x80 } else { 0 };
                    self.ended(pid, ExitStatus::from_raw(raw));
                }
                Ok(WaitStatus::Stopped(pid, _)) if pid == self.pid => self.stopped = true,
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "waitpid failed");
                    break;
                }
            }
        }
        if self.status.is_some() {
            self.take_terminal_back();
        }
    }

    fn ended(&mut self, pid: Pid, status: ExitStatus) {
        if pid == self.pid && self.status.is_none() {
            tracing::debug!(?status, "the command ended");
            self.status = Some(status);
        } else if let Some(w) = self.watcher.as_mut().filter(|w| w.pid == pid) {
            w.reaped = true;
        }
    }

    /// Job control: when CMD, in the terminal's foreground, was stopped (Ctrl-Z), `distlock`
    /// takes the terminal back and stops itself too, so that the shell sees the job stopped.
    /// Continued (`fg`), it gives the terminal to CMD's group again if it is in the foreground,
    /// and continues CMD's group (`bg` continues it in the background). While `distlock` is
    /// stopped nothing renews the lock: a stop longer than the lease loses it.
    pub fn follow_job_control(&mut self) {
        if !std::mem::take(&mut self.stopped) || self.status.is_some() {
            return;
        }
        let Some(own) = self
            .terminal
            .as_ref()
            .filter(|t| !t.returned)
            .map(|t| t.own)
        else {
            return;
        };
        tracing::debug!("the command was stopped; stopping distlock too");
        // Stopped in the foreground (Ctrl-Z): the shell gets the terminal back through us.
        // Stopped in the background (SIGTTIN): leave the terminal alone.
        if in_foreground(self.pid) {
            let _ = tcsetpgrp(stdin_fd(), own);
        }
        let _ = nix::sys::signal::raise(Signal::SIGTSTP);
        // Continued: in the foreground (`fg`) CMD gets the terminal; in the background (`bg`)
        // it only continues.
        if in_foreground(own) {
            let _ = tcsetpgrp(stdin_fd(), self.pid);
        }
        self.signal(Signal::SIGCONT);
    }

    /// True while some process of CMD's group exists (after reaping what has ended).
    pub fn alive(&mut self) -> bool {
        self.reap();
        !matches!(killpg(self.pid, None), Err(Errno::ESRCH))
    }

    /// Completes when a child may have ended (call [`reap`](Self::reap) then). Cancel safe.
    pub async fn child_event(&mut self) {
        self.sigchld.recv().await;
    }

    /// CMD has ended: if its group has the foreground (or CMD's pid is unknown after a failed
    /// start, when it had been given the terminal), `distlock`'s group takes it back.
    fn take_terminal_back(&mut self) {
        let cmd = self.pid;
        if let Some(t) = self.terminal.as_mut().filter(|t| !t.returned) {
            t.returned = true;
            let cmd_has_it = if cmd.as_raw() > 0 {
                in_foreground(cmd)
            } else {
                t.gave
            };
            if !cmd_has_it {
                return;
            }
            if let Err(e) = tcsetpgrp(stdin_fd(), t.own) {
                tracing::debug!(error = %e, "cannot take the terminal back");
            }
        }
    }

    /// Ends the supervision once the group is gone: tells the watcher to quit without
    /// killing, reaps it, and restores the terminal signals.
    pub fn finish(&mut self) {
        self.take_terminal_back();
        if let Some(mut w) = self.watcher.take() {
            if let Some(pipe) = w.pipe.take() {
                let _ = nix::unistd::write(pipe.as_fd(), &[QUIT]);
            }
            // It exits at once on QUIT; do not wait for it forever either.
            for _ in 0..200 {
                if w.reaped {
                    break;
                }
                match waitpid(w.pid, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(5)),
                    _ => break,
                }
            }
        }
        if let Some(t) = self.terminal.take() {
            for (sig, action) in t.saved {
                // SAFETY: restores the disposition distlock started with.
                let _ = unsafe { sigaction(sig, &action) };
            }
        }
    }
}

impl Drop for Group {
    /// Without [`finish`](Group::finish) (an early return, a panic), the watcher's pipe closes
    /// without QUIT and the watcher kills whatever is left of the group.
    fn drop(&mut self) {
        self.take_terminal_back();
    }
}

/// Starts the watcher (this binary again) with `read_end` as its stdin, in a process group of
/// its own, with an empty environment and no output.
fn spawn_watcher(read_end: OwnedFd) -> io::Result<Pid> {
    // /proc/self/exe works even when the binary was replaced since distlock started.
    let exe = if std::path::Path::new("/proc/self/exe").exists() {
        std::path::PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe()?
    };
    let mut command = std::process::Command::new(exe);
    command
        .arg0("distlock")
        .arg(WATCH_ARG)
        .env_clear()
        .stdin(Stdio::from(read_end))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setpgid is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            Ok(())
        });
    }
    let child = command.spawn()?;
    Ok(Pid::from_raw(child.id() as i32))
}
