//! A scheduled job that must run once per period although every instance of the service has
//! the same timer: each instance tries the lock when its timer fires; the one that gets it runs
//! the job and records the period, so a late instance sees it done. Writes carry the fence.
//!
//! `cargo run -p distlock --example scheduled_job [BACKEND_URL]` (default `memory://`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, LockRegistry, RegistryOptions};

/// The job's own bookkeeping, in the storage the job writes to: the last period done and the
/// highest fence seen (writes with a lower fence are refused).
#[derive(Default)]
struct JobStore {
    last_period: Option<u64>,
    highest_fence: u64,
    runs: Vec<(u64, usize)>,
}

impl JobStore {
    fn record(&mut self, period: u64, instance: usize, fence: u64) -> Result<(), String> {
        if fence < self.highest_fence {
            return Err(format!("stale fence {fence} < {}", self.highest_fence));
        }
        self.highest_fence = fence;
        self.last_period = Some(period);
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
    let periods = 3u64;
    let mut instances = Vec::new();
    for instance in 0..4usize {
        // One registry per instance, as separate processes would have.
        let opts = RegistryOptions::default()
            .with_prefix("example-jobs")
            .with_lease(Duration::from_secs(10));
        let registry = LockRegistry::from_backend(backend.clone(), opts)?;
        let store = store.clone();
        instances.push(tokio::spawn(async move {
            let lock = registry.obtain("nightly-report")?;
            for period in 0..periods {
                // Every instance's timer fires at about the same time, a little apart.
                tokio::time::sleep(Duration::from_millis(20 * instance as u64)).await;
                match lock.try_lock().await {
                    Ok(guard) => {
                        let done = store.lock().unwrap().last_period >= Some(period);
                        if done {
                            println!("period {period}: instance {instance} finds it already done");
                        } else {
                            println!(
                                "period {period}: instance {instance} runs the job (fence {})",
                                guard.fence()
                            );
                            tokio::time::sleep(Duration::from_millis(100)).await; // the work
                            guard.ensure_held()?;
                            store
                                .lock()
                                .unwrap()
                                .record(period, instance, guard.fence())
                                .map_err(|e| Error::NotHeld {
                                    key: format!("nightly-report: {e}"),
                                })?;
                        }
                        guard.release().await?;
                    }
                    Err(Error::NotAcquired { .. }) => {
                        println!(
                            "period {period}: instance {instance} skips, another instance runs it"
                        )
                    }
                    Err(e) => return Err(e),
                }
                tokio::time::sleep(Duration::from_millis(300 - 20 * instance as u64)).await;
            }
            Ok::<(), Error>(())
        }));
    }
    for i in instances {
        i.await.expect("instance task")?;
    }
    let store = store.lock().unwrap();
    let periods_run: Vec<u64> = store.runs.iter().map(|(p, _)| *p).collect();
    println!("\nruns: {:?}", store.runs);
    assert_eq!(
        periods_run,
        (0..periods).collect::<Vec<_>>(),
        "each period exactly once"
    );
    Ok(())
}
