//! `distlock run`: hold a lock while a command runs.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{Lock, LockGuard};
use tokio::time::Instant;

use crate::config::{exit_code, Failure, Global, EXIT_BACKEND, EXIT_LOST, EXIT_NOT_ACQUIRED};
use crate::duration::{human, parse_duration};
use crate::signals::Signals;
use crate::util::{holder_fence, say, stderr_is_terminal};

/// How long CMD has between SIGTERM and SIGKILL after the lock was lost.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// How long a release may take before distlock gives up on it (the lease then expires).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// Before the first "waiting" line: a free lock is taken well within this.
const FIRST_REPORT_AFTER: Duration = Duration::from_millis(300);
/// Between two "still waiting" lines.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// How long `run` waits for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// `lock()`: without limit (the default).
    Forever,
    /// `try_lock_for(d)`: `--wait d`.
    For(Duration),
    /// `try_lock()`: `--no-wait`.
    No,
}

/// What `run` was asked to do.
#[derive(Debug)]
pub struct RunRequest {
    pub key: String,
    pub lease: Duration,
    pub wait: WaitMode,
    pub command: Vec<OsString>,
}

/// Runs the command under the lock; returns the exit status of `distlock`.
pub async fn run(global: &Global, req: RunRequest) -> Result<i32, Failure> {
    let Some((program, program_args)) = req.command.split_first() else {
        return Err(Failure::usage(
            "run: the command to run is missing (distlock run --key K -- CMD [ARGS...])",
        ));
    };
    let grace = kill_grace()?;
    let registry = global.registry().await?;
    let lock = registry.obtain(&req.key)?.with_lease(req.lease)?;
    let key = req.key.as_str();

    // From here on distlock owns SIGINT, SIGTERM and SIGHUP: it must release the lock itself.
    let mut signals = Signals::install();
    tracing::debug!(key = %req.key, "acquiring");

    let guard = match acquire(&lock, req.wait, &mut signals).await {
        Acquired::Guard(guard) => guard,
        Acquired::Failed(distlock::Error::NotAcquired { .. }) => {
            let why = match req.wait {
                WaitMode::No => format!("lock {key:?} is busy (--no-wait)"),
                WaitMode::For(d) => format!("lock {key:?} was not acquired within {}", human(d)),
                WaitMode::Forever => format!("lock {key:?} was not acquired"),
            };
            say(&why);
            return Ok(EXIT_NOT_ACQUIRED);
        }
        Acquired::Failed(e) => return Err(e.into()),
        Acquired::Interrupted(sig) => {
            say(&format!(
                "interrupted by {} while waiting for lock {key:?}",
                signal_name(sig)
            ));
            return Ok(128 + sig);
        }
    };
    let fence = guard.fence();
    tracing::debug!(key, fence, "lock acquired; starting the command");

    let mut command = tokio::process::Command::new(program);
    command
        .args(program_args)
        .env("DISTLOCK_KEY", key)
        .env("DISTLOCK_FENCE", fence.to_string())
        .kill_on_drop(true);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let (code, what) = spawn_failure(&e);
            release(guard).await.ok();
            say(&format!("{}: {what}", program.to_string_lossy()));
            return Ok(code);
        }
    };

    let outcome = supervise(child, &guard, grace, &mut signals).await;
    let released = release(guard).await;
    match outcome {
        Supervised::Lost(status) => {
            tracing::debug!(?status, "the command ended after the lock was lost");
            Ok(EXIT_LOST)
        }
        Supervised::WaitFailed(e) => {
            say(&format!(
                "cannot wait for {}: {e}",
                program.to_string_lossy()
            ));
            Ok(EXIT_BACKEND)
        }
        Supervised::Exited(status) => match released {
            Ok(()) => Ok(status_code(status)),
            Err(distlock::Error::LockLost { .. }) => {
                say(&format!(
                    "lock {key:?} was lost before the command finished (the release found it gone)"
                ));
                Ok(EXIT_LOST)
            }
            Err(e) => {
                say(&format!(
                    "could not release lock {key:?} (its lease will expire): {e}"
                ));
                Ok(status_code(status))
            }
        },
    }
}

/// `DISTLOCK_KILL_GRACE`: milliseconds, or a duration such as `2s`.
fn kill_grace() -> Result<Duration, Failure> {
    match std::env::var("DISTLOCK_KILL_GRACE") {
        Ok(v) if !v.trim().is_empty() => {
            let v = v.trim();
            v.parse::<u64>()
                .map(Duration::from_millis)
                .or_else(|_| parse_duration(v))
                .map_err(|e| Failure::usage(format!("DISTLOCK_KILL_GRACE: {e}")))
        }
        _ => Ok(DEFAULT_KILL_GRACE),
    }
}

enum Acquired {
    Guard(LockGuard),
    Failed(distlock::Error),
    Interrupted(i32),
}

/// Takes the lock as `wait` says, showing progress on a terminal and giving up on a signal.
async fn acquire(lock: &Lock, wait: WaitMode, signals: &mut Signals) -> Acquired {
    let started = Instant::now();
    let mut attempt: std::pin::Pin<Box<dyn Future<Output = distlock::Result<LockGuard>> + Send>> =
        match wait {
            WaitMode::Forever => Box::pin({
                let lock = lock.clone();
                async move { lock.lock().await }
            }),
            WaitMode::For(d) => Box::pin({
                let lock = lock.clone();
                async move { lock.try_lock_for(d).await }
            }),
            WaitMode::No => Box::pin({
                let lock = lock.clone();
                async move { lock.try_lock().await }
            }),
        };
    let reported = Arc::new(AtomicBool::new(false));
    let reporter = (wait != WaitMode::No && stderr_is_terminal()).then(|| {
        let limit = match wait {
            WaitMode::For(d) => Some(d),
            _ => None,
        };
        tokio::spawn(report_waiting(
            lock.clone(),
            started,
            limit,
            reported.clone(),
        ))
    });
    let result = tokio::select! {
        r = &mut attempt => match r {
            Ok(guard) => Acquired::Guard(guard),
            Err(e) => Acquired::Failed(e),
        },
        sig = signals.recv() => Acquired::Interrupted(sig),
    };
    if let Some(reporter) = reporter {
        reporter.abort();
        let _ = reporter.await;
    }
    if let Acquired::Interrupted(_) = result {
        // Cancel safe: a remote attempt in flight is given back by a background task; give it
        // a moment to run before the runtime shuts down.
        drop(attempt);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if reported.load(Ordering::SeqCst) {
        if let Acquired::Guard(g) = &result {
            say(&format!(
                "acquired lock {:?} after {} (fence {})",
                lock.key(),
                human(started.elapsed()),
                g.fence()
            ));
        }
    }
    result
}

/// Prints, on a terminal, what `run` is waiting for, now and then.
async fn report_waiting(
    lock: Lock,
    started: Instant,
    limit: Option<Duration>,
    reported: Arc<AtomicBool>,
) {
    tokio::time::sleep(FIRST_REPORT_AFTER).await;
    let key = lock.key().to_owned();
    loop {
        let state = match tokio::time::timeout(Duration::from_secs(2), lock.inspect()).await {
            Ok(Ok(Some(info))) => describe_holder(info.fence, info.remaining),
            Ok(Ok(None)) => "free right now; retrying".to_owned(),
            Ok(Err(e)) => format!("state unknown: {e}"),
            Err(_) => "state unknown: the backend did not answer".to_owned(),
        };
        let line = if reported.swap(true, Ordering::SeqCst) {
            format!(
                "still waiting for lock {key:?} after {} ({state})...",
                human(started.elapsed())
            )
        } else {
            let limit = limit
                .map(|l| format!(", giving up after {}", human(l)))
                .unwrap_or_default();
            format!("waiting for lock {key:?} ({state}{limit})...")
        };
        say(&line);
        tokio::time::sleep(REPORT_EVERY).await;
    }
}

/// `held, fence F, lease left 12s` from what `inspect` reports.
pub fn describe_holder(fence: Option<u64>, remaining: Option<Duration>) -> String {
    let fence = fence.map_or_else(|| "unknown".to_owned(), |f| holder_fence(f).to_string());
    let left = remaining.map_or_else(|| "unknown".to_owned(), human);
    format!("held, fence {fence}, lease left {left}")
}

enum Supervised {
    Exited(ExitStatus),
    Lost(ExitStatus),
    WaitFailed(io::Error),
}

/// Waits for the child while holding the lock: forwards signals, and stops the child when the
/// lock is lost (SIGTERM, then SIGKILL after `grace`).
async fn supervise(
    mut child: tokio::process::Child,
    guard: &LockGuard,
    grace: Duration,
    signals: &mut Signals,
) -> Supervised {
    let pid = child.id().and_then(|p| libc::pid_t::try_from(p).ok());
    let lost = guard.lost();
    tokio::pin!(lost);
    let kill_at = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(kill_at);
    let mut was_lost = false;
    let mut killed = false;
    loop {
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(status) if was_lost => Supervised::Lost(status),
                    Ok(status) => Supervised::Exited(status),
                    Err(e) => Supervised::WaitFailed(e),
                };
            }
            () = &mut lost, if !was_lost => {
                was_lost = true;
                say(&format!(
                    "lock {:?} was lost while the command ran; sending it SIGTERM (SIGKILL after {})",
                    guard.key(),
                    human(grace)
                ));
                send(pid, libc::SIGTERM);
                kill_at.as_mut().reset(Instant::now() + grace);
            }
            () = &mut kill_at, if was_lost && !killed => {
                killed = true;
                tracing::debug!("grace period over; killing the command");
                let _ = child.start_kill();
            }
            sig = signals.recv() => {
                tracing::debug!(signal = sig, "forwarding a signal to the command");
                send(pid, sig);
            }
        }
    }
}

/// Sends `sig` to the child (not yet reaped, so its pid cannot have been reused).
fn send(pid: Option<libc::pid_t>, sig: i32) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) has no memory effects; the pid is our own unreaped child.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Releases, bounded in time. `Err(LockLost)` when the lock had been lost.
async fn release(guard: LockGuard) -> distlock::Result<()> {
    let key = guard.key().to_owned();
    match tokio::time::timeout(RELEASE_TIMEOUT, guard.release()).await {
        Ok(r) => {
            if let Err(e) = &r {
                tracing::debug!(key, error = %e, code = exit_code(e), "release failed");
            }
            r
        }
        Err(_) => Err(distlock::Error::Unavailable {
            backend: "release",
            message: format!("no answer within {}", human(RELEASE_TIMEOUT)),
        }),
    }
}

/// CMD's status as distlock's: its exit code, or 128 + the signal that ended it.
fn status_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => EXIT_BACKEND,
    }
}

/// The shell's conventions: 127 when the command does not exist, 126 when it cannot run.
fn spawn_failure(e: &io::Error) -> (i32, String) {
    match e.kind() {
        io::ErrorKind::NotFound => (127, "command not found".to_owned()),
        io::ErrorKind::PermissionDenied => (126, "permission denied".to_owned()),
        _ => (126, format!("cannot run: {e}")),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_mapping() {
        assert_eq!(status_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(status_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(status_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }

    #[test]
    fn spawn_failures_follow_the_shell() {
        assert_eq!(
            spawn_failure(&io::Error::from(io::ErrorKind::NotFound)).0,
            127
        );
        assert_eq!(
            spawn_failure(&io::Error::from(io::ErrorKind::PermissionDenied)).0,
            126
        );
    }

    #[test]
    fn holder_description() {
        assert_eq!(
            describe_holder(Some(3), Some(Duration::from_secs(12))),
            "held, fence 3072, lease left 12s"
        );
        assert_eq!(
            describe_holder(None, None),
            "held, fence unknown, lease left unknown"
        );
    }
}
