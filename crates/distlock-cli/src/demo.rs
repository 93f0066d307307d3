//! `distlock demo`: the articles' demonstration. N workers, each with its own registry (as
//! separate service instances would have), contend for one key and hold it in turn; the times
//! they get it come out the hold time apart.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use distlock::{Backend, LockGuard, LockRegistry, RegistryOptions};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::{Failure, Global};
use crate::duration::human;
use crate::signals::Signals;
use crate::util::{clock, out, say};

/// What the demo was asked to do.
#[derive(Debug)]
pub struct DemoRequest {
    pub workers: u32,
    pub hold: Duration,
    pub key: String,
}

/// How long a stopped worker waits for its abandoned attempt to be given back.
const UNDO_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the demo; returns the exit status.
pub async fn demo(global: &Global, req: DemoRequest) -> Result<i32, Failure> {
    let options = global.options()?;
    let url = global.backend_url()?;
    let first: Arc<dyn Backend> = distlock::connect(&url).await?;
    let kind = first.kind();
    let registries = registries(first, &url, &options, req.workers).await?;

    out(&format!(
        "demo: {} workers, each with its own registry on {kind}, contend for lock {:?} and hold it {} each",
        req.workers,
        req.key,
        human(req.hold)
    ));
    let mut signals = Signals::install();
    let (stop, stopped) = watch::channel(false);
    let start = Instant::now();
    let mut workers = JoinSet::new();
    let report: Report = Arc::new(print_step);
    for (i, registry) in registries.into_iter().enumerate() {
        workers.spawn(worker(
            i + 1,
            registry,
            req.key.clone(),
            req.hold,
            start,
            stopped.clone(),
            report.clone(),
        ));
    }

    let mut acquired = Vec::new();
    let mut failure: Option<distlock::Error> = None;
    let mut interrupted = None;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                None => break,
                Some(Ok(Ok(Some(at)))) => acquired.push(at),
                Some(Ok(Ok(None))) => {}
                Some(Ok(Err(e))) => {
                    failure.get_or_insert(e);
                }
                Some(Err(e)) => {
                    return Err(Failure { code: 1, message: format!("a worker failed: {e}") });
                }
            },
            sig = signals.recv(), if interrupted.is_none() => {
                interrupted = Some(sig);
                let _ = stop.send(true);
            }
        }
    }
    if let Some(sig) = interrupted {
        say("demo interrupted");
        return Ok(128 + sig);
    }
    if let Some(e) = failure {
        return Err(e.into());
    }
    out(&summary(&req.key, req.hold, &acquired));
    Ok(0)
}

/// `workers` registries over the backend of `url`, each with its own connection as separate
/// service instances would have; `first` is the first one's backend. An in-process backend is
/// shared, or the workers would not see each other.
pub async fn registries(
    first: Arc<dyn Backend>,
    url: &str,
    options: &RegistryOptions,
    workers: u32,
) -> distlock::Result<Vec<LockRegistry>> {
    let share = !first.capabilities().cross_process;
    let mut registries = Vec::with_capacity(workers as usize);
    for i in 0..workers {
        let backend = if share || i == 0 {
            first.clone()
        } else {
            distlock::connect(url).await?
        };
        registries.push(LockRegistry::from_backend(backend, options.clone())?);
    }
    Ok(registries)
}

/// What a worker tells as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// It starts waiting for the lock.
    Waiting,
    /// It got the lock `at` after the start, with `fence`, to hold it for `hold`.
    Acquired {
        at: Duration,
        fence: u64,
        hold: Duration,
    },
    /// It lost the lock while holding it.
    Lost,
    /// It gave the lock back (or stopped waiting, when stopped first).
    Done,
}

/// Where a worker's steps go: worker number, key, step.
pub type Report = Arc<dyn Fn(usize, &str, Step) + Send + Sync>;

/// The command's report: a line per acquisition and per loss.
fn print_step(n: usize, key: &str, step: Step) {
    match step {
        Step::Acquired { at, fence, .. } => out(&format!(
            "worker {n} acquired lock {key:?} at {} (+{:.2}s) fence {fence}",
            clock(SystemTime::now()),
            at.as_secs_f64(),
        )),
        Step::Lost => out(&format!("worker {n} lost lock {key:?} while holding it")),
        Step::Waiting | Step::Done => {}
    }
}

/// One worker: take the lock, say when, hold it, give it back. Returns when it got it, or
/// `None` when stopped first.
pub async fn worker(
    n: usize,
    registry: LockRegistry,
    key: String,
    hold: Duration,
    start: Instant,
    mut stop: watch::Receiver<bool>,
    report: Report,
) -> distlock::Result<Option<Duration>> {
    let lock = registry.obtain(&key)?;
    report(n, &key, Step::Waiting);
    let guard = tokio::select! {
        guard = lock.lock() => guard,
        _ = stop.changed() => {
            report(n, &key, Step::Done);
            // The process may end next: the abandoned attempt is given back in the background.
            if !registry.flush(UNDO_TIMEOUT).await {
                tracing::debug!(worker = n, "giving back an abandoned attempt timed out; its lease will expire");
            }
            return Ok(None);
        }
    };
    let guard = match guard {
        Ok(guard) => guard,
        Err(e) => {
            report(n, &key, Step::Done);
            return Err(e);
        }
    };
    let at = start.elapsed();
    let stopped = async {
        let _ = stop.changed().await;
    };
    hold_then_release(n, &key, guard, at, hold, stopped, &report).await?;
    Ok(Some(at))
}

/// Reports `guard` acquired at `at` and holds it for `hold`, or until its lease is lost or
/// `stop` completes; then reports the end and releases it. A lease lost meanwhile is no error:
/// the demonstration shows it as such.
pub async fn hold_then_release(
    n: usize,
    key: &str,
    guard: LockGuard,
    at: Duration,
    hold: Duration,
    stop: impl std::future::Future<Output = ()>,
    report: &Report,
) -> distlock::Result<()> {
    report(
        n,
        key,
        Step::Acquired {
            at,
            fence: guard.fence(),
            hold,
        },
    );
    let mut lost = false;
    tokio::select! {
        () = tokio::time::sleep(hold) => {}
        () = guard.lost() => lost = true,
        () = stop => {}
    }
    report(n, key, if lost { Step::Lost } else { Step::Done });
    release(guard).await
}

/// Releases `guard`; a lease already lost is no error.
pub async fn release(guard: LockGuard) -> distlock::Result<()> {
    match guard.release().await {
        Ok(()) | Err(distlock::Error::LockLost { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The closing line: how far apart consecutive acquisitions were.
fn summary(key: &str, hold: Duration, acquired: &[Duration]) -> String {
    let mut times = acquired.to_vec();
    match gaps(&mut times) {
        (Some(min), Some(max)) => format!(
            "{} acquisitions of lock {key:?}, one at a time; gaps between consecutive acquisitions: min {:.3}s, max {:.3}s (hold {})",
            times.len(),
            min.as_secs_f64(),
            max.as_secs_f64(),
            human(hold)
        ),
        _ => format!("{} acquisition of lock {key:?}; no gaps to measure", times.len()),
    }
}

/// The shortest and longest time between consecutive acquisitions (sorts `times`).
pub fn gaps(times: &mut [Duration]) -> (Option<Duration>, Option<Duration>) {
    times.sort();
    let gaps = times.windows(2).map(|w| w[1] - w[0]);
    (gaps.clone().min(), gaps.max())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reports_min_and_max_gap() {
        let ms = Duration::from_millis;
        let line = summary("demo", ms(300), &[ms(0), ms(610), ms(300)]);
        assert!(line.contains("min 0.300s, max 0.310s"), "{line}");
        assert!(line.starts_with("3 acquisitions"), "{line}");
        assert!(summary("demo", ms(300), &[ms(5)]).contains("no gaps"));
    }

    #[test]
    fn gaps_are_between_consecutive_acquisitions() {
        let ms = Duration::from_millis;
        let mut times = [ms(610), ms(0), ms(300)];
        assert_eq!(gaps(&mut times), (Some(ms(300)), Some(ms(310))));
        assert_eq!(gaps(&mut [ms(5)]), (None, None));
    }
}
