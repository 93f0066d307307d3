//! `distlock run`: hold a lock while a command runs.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{Lock, LockRegistry, MultiGuard, MultiLock, ShortKey};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::config::{exit_code, Failure, Global, EXIT_BACKEND, EXIT_LOST, EXIT_NOT_ACQUIRED};
use crate::duration::{human, parse_duration};
use crate::group::{Group, SpawnError};
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

/// What kind of hold `run` takes of each key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// The key's mutex (the default): nobody else holds the key.
    Exclusive,
    /// `--shared`: the read side of the key's read-write lock, beside other shared holders.
    Shared,
    /// `--write`: the write side of the key's read-write lock, alone. Where the mutex and the
    /// read-write lock are one lock this is the same as [`HoldKind::Exclusive`]; on ZooKeeper
    /// only this side keeps Curator's readers out.
    Write,
    /// `--permits N`: one of N permits of the semaphore of the key.
    Permit(u32),
}

/// The handle of `key` for holds of `kind`.
pub fn handle(registry: &LockRegistry, key: &str, kind: HoldKind) -> distlock::Result<Lock> {
    match kind {
        HoldKind::Exclusive => registry.obtain(key),
        HoldKind::Shared => Ok(registry.read_write(key)?.read().clone()),
        HoldKind::Write => Ok(registry.read_write(key)?.write().clone()),
        HoldKind::Permit(n) => registry.semaphore(key, n),
    }
}

/// What `run` was asked to do.
#[derive(Debug)]
pub struct RunRequest {
    /// At least one; the first is the one `DISTLOCK_KEY` names.
    pub keys: Vec<String>,
    pub kind: HoldKind,
    /// `None`: the registry's default (which fits what the backend grants).
    pub lease: Option<Duration>,
    pub wait: WaitMode,
    pub command: Vec<OsString>,
    /// Who the holds say they are (`--owner`); `None`: `<hostname>:<pid>`.
    pub owner: Option<distlock::Owner>,
    /// `--at-least`: the lock is kept until this long after CMD started.
    pub at_least: Option<Duration>,
    /// `elect`: the lock is an election's, and CMD also gets `DISTLOCK_TERM`.
    pub election: bool,
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
    let locks = req
        .keys
        .iter()
        .map(|k| {
            let lock = match req.lease {
                Some(lease) => handle(&registry, k, req.kind)?.with_lease(lease)?,
                None => handle(&registry, k, req.kind)?,
            };
            Ok(match &req.owner {
                Some(owner) => lock.with_owner(owner.clone()),
                None => lock,
            })
        })
        .collect::<distlock::Result<Vec<_>>>()?;
    let lease = locks
        .first()
        .map_or(registry.options().lease(), |l| l.lease());
    let locks = MultiLock::new(locks)?;
    let first = req.keys[0].as_str();
    let key = label(&req.keys);
    let key = key.as_str();

    // From here on distlock owns SIGINT, SIGTERM and SIGHUP: it must release the lock itself.
    let mut signals = Signals::install();
    tracing::debug!(key, "acquiring");

    let guard = match acquire(&registry, &locks, req.wait, &mut signals).await {
        Acquired::Guard(guard) => guard,
        Acquired::Failed(distlock::Error::NotAcquired { key: busy, .. }) => {
            let why = match req.wait {
                WaitMode::No => format!("lock {} is busy (--no-wait)", ShortKey(&busy)),
                WaitMode::For(d) => {
                    format!(
                        "lock {} was not acquired within {}",
                        ShortKey(&busy),
                        human(d)
                    )
                }
                WaitMode::Forever => format!("lock {} was not acquired", ShortKey(&busy)),
            };
            say(&why);
            return Ok(EXIT_NOT_ACQUIRED);
        }
        Acquired::Failed(e) => return Err(e.into()),
        Acquired::Interrupted(sig) => {
            say(&format!(
                "interrupted by {} while waiting for lock {key}",
                signal_name(sig)
            ));
            return Ok(128 + sig);
        }
    };
    let fence = guard.fence(first).unwrap_or_default();
    tracing::debug!(key, fence, "lock acquired; starting the command");

    let plan = KillPlan::new(lease, grace);
    if plan.cut {
        tracing::info!(
            "DISTLOCK_KILL_GRACE {} does not fit a lease of {}: if renewals fail, the command gets \
             SIGTERM {} and SIGKILL {} before the lease ends",
            human(grace),
            human(lease),
            human(plan.early_grace + plan.margin),
            human(plan.margin)
        );
    }
    let mut env = vec![
        ("DISTLOCK_KEY", first.to_owned()),
        ("DISTLOCK_FENCE", fence.to_string()),
    ];
    if req.election {
        env.push(("DISTLOCK_TERM", fence.to_string()));
    }
    if req.keys.len() > 1 {
        let fences: serde_json::Map<String, serde_json::Value> = guard
            .fences()
            .map(|(k, f)| (k.to_owned(), f.into()))
            .collect();
        env.push((
            "DISTLOCK_FENCES",
            serde_json::Value::Object(fences).to_string(),
        ));
    }
    let mut group = match Group::spawn(program, program_args, &env) {
        Ok(group) => group,
        Err(SpawnError(e)) => {
            let (code, what) = spawn_failure(&e);
            release(guard).await.ok();
            say(&format!("{}: {what}", program.to_string_lossy()));
            return Ok(code);
        }
    };

    let started = Instant::now();
    let outcome = supervise(&mut group, &guard, &plan, &mut signals).await;
    group.finish();
    if let (Some(at_least), Supervised::Exited(_)) = (req.at_least, &outcome) {
        keep_until(&guard, started + at_least, key, &mut signals).await;
    }
    let released = release(guard).await;
    match outcome {
        Supervised::Lost(status) => {
            tracing::debug!(?status, "the command ended after the lock was lost");
            Ok(EXIT_LOST)
        }
        Supervised::Exited(status) => match released {
            Ok(()) => Ok(status_code(status)),
            Err(distlock::Error::LockLost { .. }) => {
                say(&format!(
                    "lock {key} was lost before the command finished (the release found it gone)"
                ));
                Ok(EXIT_LOST)
            }
            Err(e) => {
                say(&format!(
                    "could not release lock {key} (its lease will expire): {e}"
                ));
                Ok(status_code(status))
            }
        },
    }
}

/// `DISTLOCK_KILL_GRACE`: a duration such as `2s` or `500ms` (a number alone is seconds).
fn kill_grace() -> Result<Duration, Failure> {
    match std::env::var("DISTLOCK_KILL_GRACE") {
        Ok(v) if !v.trim().is_empty() => {
            parse_duration(&v).map_err(|e| Failure::usage(format!("DISTLOCK_KILL_GRACE: {e}")))
        }
        _ => Ok(DEFAULT_KILL_GRACE),
    }
}

/// The keys of a run as messages name them: `"a"`, or `"a", "b"` (a long key shortened).
fn label(keys: &[String]) -> String {
    keys.iter()
        .map(|k| ShortKey(k).to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

enum Acquired {
    Guard(MultiGuard),
    Failed(distlock::Error),
    Interrupted(i32),
}

/// Takes the locks as `wait` says, showing progress on a terminal and giving up on a signal.
async fn acquire(
    registry: &LockRegistry,
    locks: &MultiLock,
    wait: WaitMode,
    signals: &mut Signals,
) -> Acquired {
    let started = Instant::now();
    let mut attempt: std::pin::Pin<Box<dyn Future<Output = distlock::Result<MultiGuard>> + Send>> =
        match wait {
            WaitMode::Forever => Box::pin({
                let locks = locks.clone();
                async move { locks.lock().await }
            }),
            WaitMode::For(d) => Box::pin({
                let locks = locks.clone();
                async move { locks.try_lock_for(d).await }
            }),
            WaitMode::No => Box::pin({
                let locks = locks.clone();
                async move { locks.try_lock().await }
            }),
        };
    let reported = Arc::new(AtomicBool::new(false));
    let reporter = (wait != WaitMode::No && stderr_is_terminal()).then(|| {
        let limit = match wait {
            WaitMode::For(d) => Some(d),
            _ => None,
        };
        tokio::spawn(report_waiting(
            locks.locks().to_vec(),
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
    if !matches!(result, Acquired::Guard(_)) {
        // distlock exits next: an attempt in flight, or a queue place, is given back by
        // background tasks that the runtime's end would cut off (leaving the key held or
        // queued for a lease). A second signal stops the wait.
        drop(attempt);
        tokio::select! {
            done = registry.flush(RELEASE_TIMEOUT) => if !done {
                tracing::debug!("giving back the abandoned attempt timed out; its lease will expire");
            },
            _ = signals.recv() => {}
        }
    }
    if reported.load(Ordering::SeqCst) {
        if let Acquired::Guard(g) = &result {
            let fences: Vec<String> = g.fences().map(|(_, f)| f.to_string()).collect();
            let keys: Vec<String> = g.fences().map(|(k, _)| k.to_owned()).collect();
            say(&format!(
                "acquired lock {} after {} (fence {})",
                label(&keys),
                human(started.elapsed()),
                fences.join(", ")
            ));
        }
    }
    result
}

/// Prints, on a terminal, what `run` is waiting for, now and then: the state of each key.
async fn report_waiting(
    locks: Vec<Lock>,
    started: Instant,
    limit: Option<Duration>,
    reported: Arc<AtomicBool>,
) {
    tokio::time::sleep(FIRST_REPORT_AFTER).await;
    let keys: Vec<String> = locks.iter().map(|l| l.key().to_owned()).collect();
    let key = label(&keys);
    loop {
        let mut states = Vec::with_capacity(locks.len());
        for lock in &locks {
            let state = match tokio::time::timeout(Duration::from_secs(2), lock.inspect()).await {
                Ok(Ok(Some(info))) => describe_holder(&info),
                Ok(Ok(None)) => "free right now; retrying".to_owned(),
                Ok(Err(e)) => format!("state unknown: {e}"),
                Err(_) => "state unknown: the backend did not answer".to_owned(),
            };
            states.push(if locks.len() > 1 {
                format!("{}: {state}", ShortKey(lock.key()))
            } else {
                state
            });
        }
        let state = states.join("; ");
        let line = if reported.swap(true, Ordering::SeqCst) {
            format!(
                "still waiting for lock {key} after {} ({state})...",
                human(started.elapsed())
            )
        } else {
            let limit = limit
                .map(|l| format!(", giving up after {}", human(l)))
                .unwrap_or_default();
            format!("waiting for lock {key} ({state}{limit})...")
        };
        say(&line);
        tokio::time::sleep(REPORT_EVERY).await;
    }
}

/// `held by web-1:4312, fence F, lease left 12s` from what `inspect` reports, with who holds
/// it, the kind and the number of holders and waiters where the backend tells them: `held by
/// a:1, b:2 (read, 2 holders, 1 waiting), fence F, lease left 12s`.
pub fn describe_holder(info: &distlock::LockInfo) -> String {
    let fence = info
        .fence
        .map_or_else(|| "unknown".to_owned(), |f| holder_fence(f).to_string());
    let left = info.remaining.map_or_else(|| "unknown".to_owned(), human);
    let mut about = Vec::new();
    if let Some(kind) = info.kind.filter(|k| *k != distlock::LockKind::Mutex) {
        about.push(match kind {
            distlock::LockKind::Semaphore { permits: 0 } => "semaphore".to_owned(),
            k => k.to_string(),
        });
    }
    if let Some(n) = info.holders.filter(|n| *n != 1 || !about.is_empty()) {
        about.push(format!("{n} holder{}", if n == 1 { "" } else { "s" }));
    }
    if let Some(n) = info.waiters.filter(|n| *n > 0) {
        about.push(format!("{n} waiting"));
    }
    let about = if about.is_empty() {
        String::new()
    } else {
        format!(" ({})", about.join(", "))
    };
    format!(
        "held{}{about}, fence {fence}, lease left {left}",
        by(&info.owners)
    )
}

/// ` by a, b` for at most three owners (` by a, b, c and 4 more` beyond), nothing when the
/// backend does not say.
fn by(owners: &[String]) -> String {
    const SHOWN: usize = 3;
    if owners.is_empty() {
        return String::new();
    }
    let mut text = format!(" by {}", owners[..owners.len().min(SHOWN)].join(", "));
    if owners.len() > SHOWN {
        text.push_str(&format!(" and {} more", owners.len() - SHOWN));
    }
    text
}

enum Supervised {
    /// CMD ended (and its group is gone) while the lock was held.
    Exited(ExitStatus),
    /// The lock was lost, or CMD was stopped because it was about to be lost.
    Lost(ExitStatus),
}

/// When CMD's group is stopped if renewals fail: the rule of `run`.
///
/// With healthy renewals (at about a third of the lease) the lease left never drops much
/// below two thirds of the lease. Only a lease left of a third of the lease or less means that
/// renewals have been failing for a while, so that third is the budget of the stop:
///
/// * `margin` = a tenth of the lease, at least 50 ms and at most 1 s (never more than the
///   budget): time for SIGKILL to take effect and for `distlock` to reap the group;
/// * `early_grace` = `DISTLOCK_KILL_GRACE`, cut to `budget - margin` when it does not fit;
/// * SIGTERM to the group when the lease left is `early_grace + margin` or less, SIGKILL when
///   it is `margin` or less (or `early_grace` after the SIGTERM, whichever comes first).
///
/// So the group is gone before the client's view of the lease ends, and the client's view
/// ends no later than the server's. If the lock is found lost before that (deleted on the
/// server, or expired there), the next holder may already run: the group gets SIGTERM at once
/// and SIGKILL after the full `DISTLOCK_KILL_GRACE`; if it had already got SIGTERM because
/// the lock was about to be lost, SIGKILL follows at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KillPlan {
    /// `DISTLOCK_KILL_GRACE` as configured.
    grace: Duration,
    /// The grace between SIGTERM and SIGKILL when renewals fail.
    early_grace: Duration,
    /// SIGKILL at the latest this long before the client's view of the lease ends.
    margin: Duration,
    /// Whether `early_grace` is shorter than `grace`.
    cut: bool,
}

impl KillPlan {
    fn new(lease: Duration, grace: Duration) -> KillPlan {
        let budget = lease / 3;
        let margin = (lease / 10)
            .clamp(Duration::from_millis(50), Duration::from_secs(1))
            .min(budget);
        let room = budget - margin;
        KillPlan {
            grace,
            early_grace: grace.min(room),
            margin,
            cut: grace > room,
        }
    }

    /// SIGTERM once the lease left is this or less.
    fn term_below(&self) -> Duration {
        self.early_grace + self.margin
    }
}

/// The group is being stopped: when SIGKILL comes, and why.
struct Stop {
    /// SIGKILL at this instant at the latest.
    kill_at: Instant,
    /// SIGKILL was sent.
    killed: bool,
    /// Because the lock is about to be lost (the lease left decides SIGKILL too).
    racing_the_lease: bool,
}

/// How often the group is looked at while it is being stopped or after CMD ended (SIGCHLD
/// usually comes first).
const LOOK_EVERY: Duration = Duration::from_millis(50);
/// How often otherwise, as a backstop.
const IDLE_LOOK_EVERY: Duration = Duration::from_secs(1);

/// Waits for CMD's group while holding the lock: forwards signals to the group, stops the
/// group (SIGTERM, then SIGKILL) as [`KillPlan`] says, and returns once every process of the
/// group is gone. Processes CMD leaves behind in its group when it ends are stopped the same
/// way (SIGTERM, SIGKILL after the grace) before the lock is released.
async fn supervise(
    group: &mut Group,
    guard: &MultiGuard,
    plan: &KillPlan,
    signals: &mut Signals,
) -> Supervised {
    let keys: Vec<String> = guard.fences().map(|(k, _)| k.to_owned()).collect();
    let key = label(&keys);
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut was_lost = false;
    let mut about_to_lose = false;
    let mut stop: Option<Stop> = None;
    loop {
        let now = Instant::now();
        if group.status().is_some() || stop.as_ref().is_some_and(|s| s.killed) {
            if !group.alive() {
                break;
            }
        } else {
            group.reap();
        }
        group.follow_job_control();
        if !was_lost && !guard.is_held() {
            was_lost = true;
            on_lost(group, &key, plan, &mut stop, now);
        }
        if group.status().is_some() && stop.is_none() && group.alive() {
            tracing::debug!("the command ended but left processes in its group; stopping them");
            group.signal(Signal::SIGTERM);
            stop = Some(Stop {
                kill_at: now + plan.early_grace,
                killed: false,
                racing_the_lease: true,
            });
        }
        let remaining = guard.remaining();
        if !was_lost && stop.is_none() && remaining <= plan.term_below() {
            about_to_lose = true;
            let kill_in = plan.early_grace.min(remaining.saturating_sub(plan.margin));
            say(&format!(
                "lock {key} is about to be lost (renewals failed; lease left {}); stopping the \
                 command: SIGTERM now, SIGKILL in {}",
                human(remaining),
                human(kill_in)
            ));
            group.signal(Signal::SIGTERM);
            stop = Some(Stop {
                kill_at: now + kill_in,
                killed: false,
                racing_the_lease: true,
            });
        }
        if let Some(s) = stop.as_mut().filter(|s| !s.killed) {
            if s.racing_the_lease && !was_lost {
                s.kill_at = s.kill_at.min(now + remaining.saturating_sub(plan.margin));
            }
            if now >= s.kill_at {
                tracing::debug!("killing the command's group");
                group.signal(Signal::SIGKILL);
                s.killed = true;
            }
        }
        // When to look again without an event.
        let mut wake = now
            + if stop.is_some() || group.status().is_some() {
                LOOK_EVERY
            } else {
                IDLE_LOOK_EVERY
            };
        match &stop {
            Some(s) if !s.killed => wake = wake.min(s.kill_at),
            None if !was_lost => wake = wake.min(now + remaining.saturating_sub(plan.term_below())),
            _ => {}
        }
        tokio::select! {
            () = group.child_event() => {}
            () = &mut lost, if !was_lost => {
                was_lost = true;
                on_lost(group, &key, plan, &mut stop, Instant::now());
            }
            () = tokio::time::sleep_until(wake) => {}
            sig = signals.recv() => {
                tracing::debug!(signal = sig, "forwarding a signal to the command's group");
                if let Ok(sig) = Signal::try_from(sig) {
                    group.signal(sig);
                }
            }
        }
    }
    let status = group
        .status()
        .unwrap_or_else(|| ExitStatus::from_raw(Signal::SIGKILL as i32));
    if was_lost || about_to_lose {
        Supervised::Lost(status)
    } else {
        Supervised::Exited(status)
    }
}

/// The lock is gone: SIGTERM now and SIGKILL after the full grace, or SIGKILL at once if the
/// group was already being stopped.
fn on_lost(group: &Group, key: &str, plan: &KillPlan, stop: &mut Option<Stop>, now: Instant) {
    match stop {
        None => {
            if group.status().is_none() {
                say(&format!(
                    "lock {key} was lost while the command ran; sending it SIGTERM (SIGKILL after {})",
                    human(plan.grace)
                ));
            }
            group.signal(Signal::SIGTERM);
            *stop = Some(Stop {
                kill_at: now + plan.grace,
                killed: false,
                racing_the_lease: false,
            });
        }
        Some(s) if !s.killed => {
            tracing::debug!("the lock was lost while the command was being stopped; killing it");
            group.signal(Signal::SIGKILL);
            s.killed = true;
        }
        Some(_) => {}
    }
}

/// Releases, bounded in time. `Err(LockLost)` when the lock had been lost.
/// `--at-least`: keeps the lock (renewed) until `until`, so that another instance does not
/// run the same job again at once; a signal or the loss of the lock ends the wait early.
async fn keep_until(guard: &MultiGuard, until: Instant, key: &str, signals: &mut Signals) {
    if Instant::now() >= until {
        return;
    }
    tracing::debug!(key, "the command ended; keeping the lock for --at-least");
    tokio::select! {
        () = tokio::time::sleep_until(until) => {}
        () = guard.lost() => {}
        sig = signals.recv() => {
            tracing::debug!(key, sig, "signalled while keeping the lock for --at-least");
        }
    }
}

async fn release(guard: MultiGuard) -> distlock::Result<()> {
    let keys: Vec<String> = guard.fences().map(|(k, _)| k.to_owned()).collect();
    let key = label(&keys);
    // Once the lease has ended the server lets the lock go by itself: no point waiting longer.
    let limit = RELEASE_TIMEOUT.min(guard.remaining().max(Duration::from_millis(100)));
    match tokio::time::timeout(limit, guard.release()).await {
        Ok(r) => {
            if let Err(e) = &r {
                tracing::debug!(key, error = %e, code = exit_code(e), "release failed");
            }
            r
        }
        Err(_) => Err(distlock::Error::Unavailable {
            backend: "release",
            message: format!("no answer within {}", human(limit)),
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
    match Signal::try_from(sig) {
        Ok(sig @ (Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP)) => sig.as_str(),
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
        assert_eq!(
            status_code(ExitStatus::from_raw(Signal::SIGTERM as i32)),
            143
        );
        assert_eq!(
            status_code(ExitStatus::from_raw(Signal::SIGKILL as i32)),
            137
        );
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
    fn the_kill_plan_fits_the_grace_into_a_third_of_the_lease() {
        let ms = Duration::from_millis;
        // The defaults: 30 s lease, 5 s grace fits; SIGTERM at 6 s left, SIGKILL at 1 s.
        let plan = KillPlan::new(Duration::from_secs(30), ms(5000));
        assert_eq!(
            (plan.early_grace, plan.margin, plan.cut),
            (ms(5000), ms(1000), false)
        );
        assert_eq!(plan.term_below(), ms(6000));
        // 3 s lease: margin 300 ms, room for 700 ms of grace.
        let plan = KillPlan::new(Duration::from_secs(3), ms(500));
        assert_eq!(
            (plan.early_grace, plan.margin, plan.cut),
            (ms(500), ms(300), false)
        );
        let plan = KillPlan::new(Duration::from_secs(3), ms(5000));
        assert_eq!(
            (plan.early_grace, plan.margin, plan.cut),
            (ms(700), ms(300), true)
        );
        assert_eq!(plan.grace, ms(5000), "the full grace after a loss");
        // Very short leases: the margin never exceeds the budget, the grace may be zero.
        let plan = KillPlan::new(ms(90), ms(5000));
        assert_eq!((plan.early_grace, plan.margin), (ms(0), ms(30)));
        // Whatever the lease, SIGTERM comes only below a third of it: healthy renewal (at a
        // third of the lease) keeps the lease left above two thirds.
        for lease_ms in [
            1, 10, 100, 400, 1000, 3000, 10_000, 30_000, 600_000, 86_400_000,
        ] {
            for grace_ms in [0, 1, 700, 5000, 60_000] {
                let lease = ms(lease_ms);
                let plan = KillPlan::new(lease, ms(grace_ms));
                assert!(plan.term_below() <= lease / 3, "{lease_ms} {grace_ms}");
                assert!(plan.early_grace <= ms(grace_ms));
                assert_eq!(plan.cut, plan.early_grace < ms(grace_ms));
            }
        }
    }

    #[test]
    fn holder_description() {
        use distlock::{LockInfo, LockKind};
        let mutex = LockInfo::new(Some(3), Some(Duration::from_secs(12)));
        assert_eq!(describe_holder(&mutex), "held, fence 3072, lease left 12s");
        assert_eq!(
            describe_holder(&mutex.clone().with_kind(LockKind::Mutex).with_holders(1)),
            "held, fence 3072, lease left 12s"
        );
        assert_eq!(
            describe_holder(&LockInfo::new(None, None)),
            "held, fence unknown, lease left unknown"
        );
        let readers = LockInfo::new(Some(3), Some(Duration::from_secs(12)))
            .with_kind(LockKind::Read)
            .with_holders(2)
            .with_waiters(1);
        assert_eq!(
            describe_holder(&readers),
            "held (read, 2 holders, 1 waiting), fence 3072, lease left 12s"
        );
        let permit = LockInfo::new(Some(3), None)
            .with_kind(LockKind::Semaphore { permits: 4 })
            .with_holders(1);
        assert_eq!(
            describe_holder(&permit),
            "held (semaphore(4), 1 holder), fence 3072, lease left unknown"
        );
    }
}
