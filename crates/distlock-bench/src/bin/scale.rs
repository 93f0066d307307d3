//! The scale figures of one backend, measured through the public [`LockRegistry`] API
//! (`bench/scale/run.sh` runs it on every backend):
//!
//! 1. **idle handles**: `obtain()` of `--idle` distinct keys (kept), RSS growth in total and per
//!    handle;
//! 2. **held locks**: `--held` distinct keys acquired concurrently (`--concurrency` tasks) with a
//!    `--lease` lease: the acquire rate and the RSS growth per held lock;
//! 3. **renewal**: the locks held for `--hold`, the CPU time of this process and of the server
//!    process (with its children) in that window only, as a percentage of one core;
//! 4. **release** of all of them concurrently: the release rate.
//!
//! ```text
//! cargo run --release -p distlock-bench --features scale --bin scale -- --backend memory://
//! scale --backend redis://127.0.0.1:6379 --held 100000 --hold 20s --json
//! ```
//!
//! The server's CPU is read from `/proc/PID/stat`; PID is `--server-pid` or the process that
//! listens on the URL's loopback port (found through `/proc/net/tcp*` and `/proc/*/fd`, so only
//! a server of this user is found).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::duration::parse_duration;
use distlock::{Lock, LockGuard, LockRegistry, RegistryOptions};
use distlock_bench::cpu_s;
use distlock_bench::procstat::{listening_pid, process_tree_cpu_s, url_port};
use distlock_bench::spawn::spawn;
use serde::Serialize;

const USAGE: &str =
    "usage: scale (--backend URL | --spawn KIND) [--idle N] [--held N] [--lease DUR] [--hold DUR] \
                     [--concurrency N] [--server-pid PID] [--json]";

#[derive(Debug)]
struct Args {
    backend: String,
    spawn: Option<String>,
    idle: usize,
    held: usize,
    lease: Duration,
    hold: Duration,
    concurrency: usize,
    server_pid: Option<u32>,
    json: bool,
}

impl Args {
    fn parse(argv: &[impl AsRef<str>]) -> Result<Args, String> {
        let mut a = Args {
            backend: String::new(),
            spawn: None,
            idle: 1_000_000,
            held: 100_000,
            lease: Duration::from_secs(30),
            hold: Duration::from_secs(60),
            concurrency: 1000,
            server_pid: None,
            json: false,
        };
        let mut it = argv.iter().map(AsRef::as_ref);
        while let Some(flag) = it.next() {
            if flag == "--json" {
                a.json = true;
                continue;
            }
            if flag == "-h" || flag == "--help" {
                return Err(USAGE.into());
            }
            let value = it
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let number = |v: &str| {
                v.replace('_', "")
                    .parse::<usize>()
                    .map_err(|_| format!("{flag}: not a number: {v:?}"))
            };
            match flag {
                "--backend" => a.backend = value.to_owned(),
                "--spawn" => a.spawn = Some(value.to_owned()),
                "--idle" => a.idle = number(value)?,
                "--held" => a.held = number(value)?,
                "--lease" => a.lease = parse_duration(value).map_err(|e| format!("{flag}: {e}"))?,
                "--hold" => a.hold = parse_duration(value).map_err(|e| format!("{flag}: {e}"))?,
                "--concurrency" => a.concurrency = number(value)?.max(1),
                "--server-pid" => {
                    a.server_pid = Some(
                        value
                            .parse()
                            .map_err(|_| format!("{flag}: not a pid: {value:?}"))?,
                    )
                }
                other => return Err(format!("unknown option {other:?}\n{USAGE}")),
            }
        }
        if a.backend.is_empty() == a.spawn.is_none() {
            return Err(format!("one of --backend and --spawn is required\n{USAGE}"));
        }
        Ok(a)
    }
}

/// This process's resident set in bytes (`VmRSS` of `/proc/self/status`).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

#[derive(Debug, Default, Serialize)]
struct Report {
    backend: String,
    idle_handles: usize,
    idle_rss_mb: f64,
    idle_bytes_per_handle: f64,
    held_locks: usize,
    lease_s: f64,
    concurrency: usize,
    acquire_per_s: f64,
    held_rss_mb: f64,
    held_bytes_per_lock: f64,
    hold_s: f64,
    client_renewal_cpu_pct: f64,
    server_pid: Option<u32>,
    server_renewal_cpu_pct: Option<f64>,
    lost_during_hold: usize,
    release_per_s: f64,
}

fn mb(bytes: u64) -> f64 {
    (bytes as f64 / 1e6 * 10.0).round() / 10.0
}

fn per(bytes: u64, n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        (bytes as f64 / n as f64).round()
    }
}

fn rate(n: usize, took: Duration) -> f64 {
    (n as f64 / took.as_secs_f64().max(1e-9)).round()
}

/// Runs `work(i)` for every `i < n` on `concurrency` tasks; the first error ends the run.
async fn concurrently<T, F, Fut>(n: usize, concurrency: usize, work: F) -> Result<Vec<T>, String>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<T, String>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let work = Arc::new(work);
    let results: Arc<Mutex<Vec<T>>> = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.min(n.max(1)) {
        let (next, work, results) = (next.clone(), work.clone(), results.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                mine.push(work(i).await?);
            }
            results
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(mine);
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| format!("a worker task failed: {e}"))??;
    }
    let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
    Ok(std::mem::take(&mut *results))
}

async fn run(a: &Args) -> Result<Report, String> {
    let shown = distlock::redact(&a.backend);
    let run_id = format!("scale-{}-{}", std::process::id(), distlock_bench::mono_ns());
    let opts = RegistryOptions::default()
        .with_prefix(run_id.clone())
        .with_lease(a.lease)
        // Every handle of the run stays referenced, so the cache must be allowed to hold them.
        .with_max_cached_locks(a.idle.max(a.held) + 16);
    let registry = LockRegistry::connect(&a.backend, opts.clone())
        .await
        .map_err(|e| format!("cannot use backend {shown}: {e}"))?;
    let probe = registry
        .obtain("probe")
        .map_err(|e| format!("{shown}: {e}"))?;
    match tokio::time::timeout(Duration::from_secs(15), probe.inspect()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(format!("backend {shown} does not answer: {e}")),
        Err(_) => return Err(format!("backend {shown} does not answer within 15 s")),
    }
    let mut report = Report {
        backend: shown.clone(),
        idle_handles: a.idle,
        held_locks: a.held,
        lease_s: a.lease.as_secs_f64(),
        hold_s: a.hold.as_secs_f64(),
        concurrency: a.concurrency,
        ..Report::default()
    };

    // Idle handles: a registry of their own, kept to the end so that the held phase's
    // allocations cannot reuse memory the idle phase freed.
    let idle_registry =
        LockRegistry::from_backend(registry.backend().clone(), opts).map_err(|e| e.to_string())?;
    let rss0 = rss_bytes();
    let mut idle: Vec<Lock> = Vec::with_capacity(a.idle);
    for i in 0..a.idle {
        idle.push(
            idle_registry
                .obtain(&format!("idle:{i}"))
                .map_err(|e| e.to_string())?,
        );
    }
    let grown = rss_bytes().saturating_sub(rss0);
    report.idle_rss_mb = mb(grown);
    report.idle_bytes_per_handle = per(grown, a.idle);

    // Held locks, acquired concurrently.
    let rss0 = rss_bytes();
    let locks: Arc<Vec<Lock>> = Arc::new(
        (0..a.held)
            .map(|i| registry.obtain(&format!("held:{i}")))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?,
    );
    let started = Instant::now();
    let handles = locks.clone();
    let guards: Vec<LockGuard> = concurrently(a.held, a.concurrency, move |i| {
        let lock = handles[i].clone();
        async move {
            lock.try_lock()
                .await
                .map_err(|e| format!("acquiring {}: {e}", lock.key()))
        }
    })
    .await?;
    report.acquire_per_s = rate(a.held, started.elapsed());
    let grown = rss_bytes().saturating_sub(rss0);
    report.held_rss_mb = mb(grown);
    report.held_bytes_per_lock = per(grown, a.held);

    // The hold: renewals only.
    report.server_pid = a
        .server_pid
        .or_else(|| url_port(&a.backend).and_then(listening_pid));
    let server0 = report.server_pid.and_then(process_tree_cpu_s);
    let (cpu0, t0) = (cpu_s(), Instant::now());
    tokio::time::sleep(a.hold).await;
    let (cpu1, window) = (cpu_s(), t0.elapsed().as_secs_f64());
    let server1 = report.server_pid.and_then(process_tree_cpu_s);
    report.client_renewal_cpu_pct = ((cpu1 - cpu0) / window * 1000.0).round() / 10.0;
    report.server_renewal_cpu_pct = server0
        .zip(server1)
        .map(|(s0, s1)| ((s1 - s0) / window * 1000.0).round() / 10.0);
    report.lost_during_hold = guards.iter().filter(|g| !g.is_held()).count();

    // Release, concurrently.
    let guards: Arc<Vec<Mutex<Option<LockGuard>>>> =
        Arc::new(guards.into_iter().map(|g| Mutex::new(Some(g))).collect());
    let started = Instant::now();
    let n = guards.len();
    let lost_at_release = concurrently(n, a.concurrency, move |i| {
        let guard = guards[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        async move {
            match guard {
                Some(g) => match g.release().await {
                    Ok(()) => Ok(0usize),
                    Err(distlock::Error::LockLost { .. }) => Ok(1),
                    Err(e) => Err(format!("releasing: {e}")),
                },
                None => Ok(0),
            }
        }
    })
    .await?;
    report.release_per_s = rate(n, started.elapsed());
    report.lost_during_hold = report
        .lost_during_hold
        .max(lost_at_release.iter().sum::<usize>());
    drop(idle);
    Ok(report)
}

fn print_text(r: &Report) {
    println!("backend                {}", r.backend);
    println!(
        "idle handles           {}: {} MB RSS, {} bytes each",
        r.idle_handles, r.idle_rss_mb, r.idle_bytes_per_handle
    );
    println!(
        "held locks             {} (lease {} s, {} tasks): acquired at {}/s, {} MB RSS, {} bytes each",
        r.held_locks,
        r.lease_s,
        r.concurrency,
        r.acquire_per_s,
        r.held_rss_mb,
        r.held_bytes_per_lock
    );
    let server = match (r.server_pid, r.server_renewal_cpu_pct) {
        (Some(pid), Some(pct)) => format!("{pct}% of a core (pid {pid} and its children)"),
        _ => "not measured (in-process backend, or pass --server-pid)".into(),
    };
    println!(
        "renewal over {} s      client {}% of a core; server {server}; lost {}",
        r.hold_s, r.client_renewal_cpu_pct, r.lost_during_hold
    );
    println!("release                {}/s", r.release_per_s);
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match Args::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("scale: {e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("scale: no Tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    // Dropped at the end of main, after the run: the server outlives every request to it.
    let mut args = args;
    let _server = match args.spawn.as_deref().map(spawn) {
        None => None,
        Some(Ok(s)) => {
            args.backend = s.url.clone();
            args.server_pid = args.server_pid.or(s.pid);
            Some(s)
        }
        Some(Err(e)) => {
            eprintln!("scale: {e}");
            std::process::exit(1);
        }
    };
    match rt.block_on(run(&args)) {
        Ok(report) if args.json => println!(
            "{}",
            serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        ),
        Ok(report) => print_text(&report),
        Err(e) => {
            eprintln!("scale: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_their_errors() {
        let a =
            Args::parse(&["--backend", "memory://", "--hold", "20s", "--held", "1_000"]).unwrap();
        assert_eq!(
            (a.hold, a.held, a.idle),
            (Duration::from_secs(20), 1000, 1_000_000)
        );
        assert!(
            Args::parse(&["--held", "5"]).is_err(),
            "the backend is required"
        );
        assert!(Args::parse(&["--backend", "memory://", "--spawn", "redis"]).is_err());
        assert_eq!(
            Args::parse(&["--spawn", "redis"]).unwrap().spawn.as_deref(),
            Some("redis")
        );
        assert!(Args::parse(&["--backend", "memory://", "--hold", "soon"]).is_err());
        assert!(Args::parse(&["--backend", "memory://", "--nope", "1"]).is_err());
        assert!(Args::parse(&["--backend"]).is_err());
    }

    #[test]
    fn this_process_has_a_resident_set_and_cpu_time() {
        assert!(rss_bytes() > 0);
        assert!(process_tree_cpu_s(std::process::id()).is_some());
    }
}
