//! Acquire + release over HTTP/1.1 keep-alive (`distlock serve`) against the same backend used
//! directly through the library, and the memory of waiters that long-poll the service.
//! `bench/http/run.sh` builds and runs it; `bench/http/README.md` has the results.
//!
//! ```text
//! http_bench --distlock PATH --backend URL [--seconds N] [--concurrency C] [--waiters W]
//! ```
//!
//! Prints one JSON line: cycles/s direct and over HTTP, their ratio, and the service's resident
//! memory before and with W requests waiting for one held key.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockRegistry, RegistryOptions};
use serde_json::json;

struct Args {
    distlock: String,
    backend: String,
    seconds: u64,
    concurrency: usize,
    waiters: usize,
}

fn args() -> Args {
    let mut a = Args {
        distlock: "target/release/distlock".into(),
        backend: "memory://".into(),
        seconds: 5,
        concurrency: 16,
        waiters: 1000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--distlock" => a.distlock = value,
            "--backend" => a.backend = value,
            "--seconds" => a.seconds = value.parse().expect("--seconds N"),
            "--concurrency" => a.concurrency = value.parse().expect("--concurrency C"),
            "--waiters" => a.waiters = value.parse().expect("--waiters W"),
            other => panic!("unknown option {other}"),
        }
    }
    a
}

/// Runs `cycle(task)` on `tasks` tasks for `length`; cycles per second.
async fn measure<F, Fut>(tasks: usize, length: Duration, cycle: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let cycle = Arc::new(cycle);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (cycle, stop, count) = (cycle.clone(), stop.clone(), count.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    cycle(i).await;
                    count.fetch_add(1, Ordering::Relaxed);
                    // An in-process backend never waits: let the timer and the others run.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("bench task");
    }
    count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn start_service(a: &Args, prefix: &str) -> (Child, String) {
    let mut child = Command::new(&a.distlock)
        .args([
            "--backend",
            &a.backend,
            "--prefix",
            prefix,
            "serve",
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("distlock serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("address line");
    let base = line
        .trim()
        .strip_prefix("distlock serve: listening on ")
        .expect("listening line")
        .to_owned();
    (child, base)
}

#[tokio::main]
async fn main() {
    let a = args();
    let prefix = format!("bench{}", std::process::id());

    let options = RegistryOptions::default()
        .with_prefix(prefix.clone())
        .with_renew(false)
        .with_max_local_handoffs(0);
    let registry = LockRegistry::connect(&a.backend, options)
        .await
        .expect("backend");
    let (mut service, base) = start_service(&a, &prefix);
    let http = reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(a.waiters + a.concurrency)
        .build()
        .expect("client");

    // Direct and HTTP alternate in one-second slices, so that a change of load on the machine
    // falls on both alike.
    let (mut direct, mut over_http) = (0.0, 0.0);
    for _ in 0..a.seconds {
        let registry = registry.clone();
        direct += measure(a.concurrency, Duration::from_secs(1), move |i| {
            let registry = registry.clone();
            async move {
                let guard = registry
                    .obtain(&format!("direct-{i}"))
                    .expect("key")
                    .try_lock()
                    .await
                    .expect("free key");
                guard.release().await.expect("release");
            }
        })
        .await;
        let (http, base) = (http.clone(), base.clone());
        over_http += measure(a.concurrency, Duration::from_secs(1), move |i| {
            let (http, url) = (http.clone(), format!("{base}/v1/locks/http-{i}"));
            async move {
                let r = http.post(&url).send().await.expect("POST");
                assert_eq!(r.status(), 200, "POST {url}");
                let granted: serde_json::Value = r.json().await.expect("JSON");
                let token = granted["token"].as_str().expect("token");
                let r = http
                    .delete(format!("{url}/{token}"))
                    .send()
                    .await
                    .expect("DELETE");
                assert_eq!(r.status(), 204);
            }
        })
        .await;
    }
    let seconds = a.seconds.max(1) as f64;
    let (direct, over_http) = (direct / seconds, over_http / seconds);

    // Waiters: one holder, then `waiters` requests that wait for the same key.
    let held = http
        .post(format!("{base}/v1/locks/wait"))
        .json(&json!({"lease_ms": 300_000}))
        .send()
        .await
        .expect("hold");
    assert_eq!(held.status(), 200);
    let before = rss_kib(service.id());
    let waiting: Vec<_> = (0..a.waiters)
        .map(|_| {
            let (http, url) = (http.clone(), format!("{base}/v1/locks/wait"));
            tokio::spawn(async move {
                let _ = http
                    .post(url)
                    .json(&json!({"wait_ms": 120_000}))
                    .send()
                    .await;
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list: serde_json::Value = http
            .get(format!("{base}/v1/locks"))
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("JSON");
        if list["waiters"].as_array().map_or(0, Vec::len) >= a.waiters {
            break;
        }
        assert!(Instant::now() < deadline, "the waiters did not all arrive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let with_waiters = rss_kib(service.id());
    let _ = Command::new("kill").arg(service.id().to_string()).status();
    let _ = service.wait();
    for w in waiting {
        w.abort();
    }

    println!(
        "{}",
        json!({
            "backend": distlock::redact(&a.backend),
            "concurrency": a.concurrency,
            "seconds": a.seconds,
            "direct_cycles_per_s": direct.round(),
            "http_cycles_per_s": over_http.round(),
            "ratio": (over_http / direct * 100.0).round() / 100.0,
            "waiters": a.waiters,
            "rss_before_kib": before,
            "rss_with_waiters_kib": with_waiters,
            "extra_rss_mib": ((with_waiters.saturating_sub(before)) as f64 / 1024.0 * 10.0).round() / 10.0,
        })
    );
}
