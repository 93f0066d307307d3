//! A scheduled job that must run once per period although every instance of the service has
//! the same timer, and the timers are a little apart (clocks drift, schedulers lag).
//!
//! Each instance tries the lock when its timer fires. The one that gets it runs the job, which
//! takes a moment, and keeps the lock for at least `AT_LEAST` after it started
//! ([`LockGuard::release_not_before`], ShedLock's `lockAtLeastFor`): an instance whose timer
//! fires later within the same period finds the lock busy and skips, although the job itself
//! is long done. Without it, that instance would find the lock free and run the job again.
//! The job's writes carry the fence, and each instance says who it is ([`Owner`]), so
//! `distlock status nightly-report` names the instance running it.
//!
//! `cargo run -p distlock --example scheduled_job [BACKEND_URL]` (default `memory://`).
//!
//! [`LockGuard::release_not_before`]: distlock::LockGuard::release_not_before

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, LockRegistry, Owner, RegistryOptions};
use tokio::time::Instant;

/// How far apart the instances' timers fire at most.
const SKEW: Duration = Duration::from_millis(150);
/// How long the job takes: less than the skew, so a late timer would run it again.
const WORK: Duration = Duration::from_millis(50);
/// The lock is kept this long after the job started: more than the skew, less than a period.
const AT_LEAST: Duration = Duration::from_millis(400);
/// The schedule.
const PERIOD: Duration = Duration::from_millis(600);
const PERIODS: u64 = 3;
const INSTANCES: u32 = 4;

/// The job's own storage: it refuses writes with a fence below the highest it saw.
#[derive(Default)]
struct JobStore {
    highest_fence: u64,
    runs: Vec<(u64, u32)>,
}

impl JobStore {
    fn record(&mut self, period: u64, instance: u32, fence: u64) -> Result<(), String> {
        if fence < self.highest_fence {
            return Err(format!("stale fence {fence} < {}", self.highest_fence));
        }
        self.highest_fence = fence;
        self.runs.push((period, instance));
        Ok(())
    }
}

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    let backend = distlock::connect(&url).await?;
    let store = Arc::new(Mutex::new(JobStore::default()));
    let start = Instant::now();
    let mut instances = Vec::new();
    for instance in 0..INSTANCES {
        // One registry per instance, as separate processes would have.
        let opts = RegistryOptions::default()
            .with_prefix("example-jobs")
            .with_lease(Duration::from_secs(10))
            .with_owner(Owner::new(format!("report-instance-{instance}"))?);
        let registry = LockRegistry::from_backend(backend.clone(), opts)?;
        let store = store.clone();
        instances.push(tokio::spawn(async move {
            let lock = registry.obtain("nightly-report")?;
            for period in 0..PERIODS {
                // This instance's timer: the period's start, plus its own lag.
                let lag = SKEW * instance / (INSTANCES - 1);
                tokio::time::sleep_until(start + PERIOD * period as u32 + lag).await;
                let fired = Instant::now();
                match lock.try_lock().await {
                    Ok(guard) => {
                        println!(
                            "period {period}: instance {instance} runs the job (fence {})",
                            guard.fence()
                        );
                        tokio::time::sleep(WORK).await;
                        guard.ensure_held()?;
                        store
                            .lock()
                            .unwrap()
                            .record(period, instance, guard.fence())
                            .map_err(|e| Error::NotHeld {
                                key: format!("nightly-report: {e}"),
                            })?;
                        // Done in 50 ms, but kept until 400 ms after the timer fired.
                        guard.release_not_before(fired + AT_LEAST).await?;
                    }
                    Err(Error::NotAcquired { .. }) => {
                        println!("period {period}: instance {instance} skips: the job is taken")
                    }
                    Err(e) => return Err(e),
                }
            }
            registry.flush(Duration::from_secs(5)).await;
            Ok::<(), Error>(())
        }));
    }
    for i in instances {
        i.await.expect("instance task")?;
    }
    let store = store.lock().unwrap();
    let periods_run: Vec<u64> = store.runs.iter().map(|(p, _)| *p).collect();
    println!("\nruns (period, instance): {:?}", store.runs);
    assert_eq!(
        periods_run,
        (0..PERIODS).collect::<Vec<_>>(),
        "each period exactly once"
    );
    Ok(())
}
