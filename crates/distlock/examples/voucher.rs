//! The articles' business case: a voucher may be redeemed once, but many requests for it arrive
//! at once, on different instances of the service.
//!
//! 1. Twenty instances (each with its own [`LockRegistry`], as separate processes would have)
//!    try to process `voucher:42` at the same moment with `try_lock`. Exactly one processes it;
//!    the others answer "already being processed" at once.
//! 2. A holder that stalls past its lease (renewal off, short lease) loses the lock to another
//!    instance. When it wakes up and writes anyway, the store refuses the write because its
//!    fence is lower than the one it has already accepted.
//!
//! ```text
//! cargo run -p distlock --example voucher                          # in-process (memory://)
//! cargo run -p distlock --example voucher -- redis://127.0.0.1:6379
//! cargo run -p distlock --example voucher -- sqlite:///tmp/vouchers.db
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Backend, Error, LockRegistry, RegistryOptions};
use tokio::sync::Barrier;

const KEY: &str = "voucher:42";
const INSTANCES: usize = 20;

/// The storage the lock protects: it remembers the highest fence it accepted and refuses
/// writes that carry a lower one. This check, not the lock alone, is what makes a stale
/// holder harmless.
#[derive(Debug, Default)]
struct VoucherStore {
    state: Mutex<StoreState>,
}

#[derive(Debug, Default)]
struct StoreState {
    highest_fence: u64,
    writes: Vec<String>,
}

impl VoucherStore {
    fn write(&self, fence: u64, what: &str) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if fence < state.highest_fence {
            return Err(format!(
                "refused {what:?}: fence {fence} is lower than {} already accepted",
                state.highest_fence
            ));
        }
        state.highest_fence = fence;
        state.writes.push(what.to_owned());
        Ok(())
    }

    fn writes(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .writes
            .clone()
    }
}

/// Makes one registry per simulated service instance. Each gets its own connection, except on
/// an in-process backend (`memory://`), which must be shared for the instances to see each
/// other at all.
struct Instances {
    url: String,
    first: Arc<dyn Backend>,
}

impl Instances {
    async fn connect(url: &str) -> distlock::Result<Self> {
        Ok(Instances {
            url: url.to_owned(),
            first: distlock::connect(url).await?,
        })
    }

    async fn registry(&self, options: RegistryOptions) -> distlock::Result<LockRegistry> {
        let backend = if self.first.capabilities().cross_process {
            distlock::connect(&self.url).await?
        } else {
            self.first.clone()
        };
        LockRegistry::from_backend(backend, options)
    }
}

#[tokio::main]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    if let Err(e) = run(&url).await {
        eprintln!("{}", failure_line(e.as_ref()));
        std::process::exit(1);
    }
}

/// What a user reads when the example fails (say, the backend is down): one line, the error's
/// `Display`, not its `Debug` form.
fn failure_line(e: &dyn std::error::Error) -> String {
    let text = e.to_string();
    format!(
        "voucher: {}",
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    )
}

async fn run(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!("backend: {}", distlock::redact(url));
    let instances = Instances::connect(url).await?;
    let store = Arc::new(VoucherStore::default());

    // --- 1. Twenty concurrent requests, one voucher -------------------------------------------
    println!("\n{INSTANCES} instances receive a request to redeem voucher 42 at the same moment");
    let mut registries = Vec::with_capacity(INSTANCES);
    for _ in 0..INSTANCES {
        registries.push(instances.registry(RegistryOptions::default()).await?);
    }
    let start = Arc::new(Barrier::new(INSTANCES));
    // The winner keeps the lock until every instance has answered, so that the outcome does not
    // depend on scheduling: in real life the processing simply takes longer than the attempts.
    let answered = Arc::new(Barrier::new(INSTANCES));
    let processed = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut requests = Vec::with_capacity(INSTANCES);
    for (i, registry) in registries.into_iter().enumerate() {
        let (start, answered) = (start.clone(), answered.clone());
        let (store, processed, refused) = (store.clone(), processed.clone(), refused.clone());
        requests.push(tokio::spawn(async move {
            let instance = i + 1;
            let lock = registry.obtain(KEY)?;
            start.wait().await;
            match lock.try_lock().await {
                Ok(guard) => {
                    println!(
                        "instance {instance:2}: got the lock (fence {}), processing voucher 42",
                        guard.fence()
                    );
                    answered.wait().await;
                    tokio::time::sleep(Duration::from_millis(100)).await; // the actual work
                    guard.ensure_held()?;
                    let what = format!("voucher 42 redeemed by instance {instance}");
                    store
                        .write(guard.fence(), &what)
                        .expect("the first write is accepted");
                    processed.fetch_add(1, Ordering::SeqCst);
                    guard.release().await?;
                    println!("instance {instance:2}: done, lock released");
                }
                Err(Error::NotAcquired { .. }) => {
                    println!("instance {instance:2}: voucher 42 is already being processed");
                    refused.fetch_add(1, Ordering::SeqCst);
                    answered.wait().await;
                }
                Err(e) => return Err(e),
            }
            Ok::<(), Error>(())
        }));
    }
    for request in requests {
        request.await??;
    }
    let processed = processed.load(Ordering::SeqCst);
    let refused = refused.load(Ordering::SeqCst);
    println!("processed: {processed}, answered \"already being processed\": {refused}");
    assert_eq!(processed, 1, "exactly one instance processes the voucher");
    assert_eq!(refused, INSTANCES - 1);

    // --- 2. A stale holder is stopped by the fence ---------------------------------------------
    println!("\ninstance A takes the lock with a 300 ms lease and renewal off, then stalls");
    let no_renewal = RegistryOptions::default()
        .with_renew(false)
        .with_lease(Duration::from_millis(300));
    let a = instances.registry(no_renewal).await?;
    let b = instances.registry(RegistryOptions::default()).await?;

    let stale = a.obtain(KEY)?.lock().await?;
    let stale_fence = stale.fence();
    // A checks that it holds the lock, then stalls (a GC pause, a stopped VM) past its lease.
    stale.ensure_held()?;
    println!("instance A: holds the lock with fence {stale_fence}; stalling for 600 ms");
    let stall = tokio::time::sleep(Duration::from_millis(600));

    let fresh = b.obtain(KEY)?.try_lock_for(Duration::from_secs(5)).await?;
    println!(
        "instance B: got the lock after A's lease ran out (fence {})",
        fresh.fence()
    );
    assert!(fresh.fence() > stale_fence, "fences increase per key");
    store
        .write(fresh.fence(), "voucher 42 refunded by instance B")
        .expect("the new holder's write is accepted");
    println!("instance B: wrote with fence {}: accepted", fresh.fence());

    stall.await;
    // A resumes where it stopped, after its check, and writes. The lock could not prevent
    // this; the fence makes the store refuse it.
    let stale_write = store.write(stale_fence, "voucher 42 redeemed again by instance A");
    match &stale_write {
        Ok(()) => println!("instance A: wrote with fence {stale_fence}: ACCEPTED (wrong)"),
        Err(why) => println!("instance A: wrote with fence {stale_fence}: {why}"),
    }
    assert!(stale_write.is_err(), "the stale write must be refused");
    println!(
        "instance A: is_held() = {}; release: {}",
        stale.is_held(),
        match stale.release().await {
            Ok(()) => "released".to_owned(),
            Err(e) => e.to_string(),
        }
    );
    fresh.release().await?;

    println!("\nthe store accepted:");
    for write in store.writes() {
        println!("  {write}");
    }
    assert_eq!(store.writes().len(), 2);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_backend_reads_as_one_line() {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let e = run("redis://127.0.0.1:1")
            .await
            .expect_err("nothing listens on port 1");
        let line = failure_line(e.as_ref());
        assert!(line.starts_with("voucher: redis unavailable"), "{line}");
        assert!(
            !line.contains('\n') && !line.contains("Unavailable {"),
            "{line}"
        );
        let multi = Error::InvalidConfig("first\nsecond".into());
        assert_eq!(
            failure_line(&multi),
            "voucher: invalid configuration: first second"
        );
    }
}
