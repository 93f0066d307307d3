//! Leader elections on one backend (`bench/election/run.sh` runs it on every backend):
//!
//! 1. **failover**: a leader in a child process (this program started again) is killed with
//!    SIGKILL while a standby campaigns; the time from the kill to the standby leading, per
//!    round. A dead leader is replaced when its lease ends, so this is bounded by the lease.
//! 2. **hand-over**: a leader resigns while a standby campaigns; the time from the resignation
//!    to the standby leading.
//! 3. **idle campaigns**: `--candidates` registries campaign while a leader holds, for
//!    `--seconds`; this process's CPU (and the server's, where its pid is known) per candidate
//!    and second, over the same window without the candidates.
//!
//! ```text
//! cargo run --release -p distlock-bench --features scale,redis --bin election_bench -- --spawn redis
//! election_bench --backend sqlite:///tmp/e.db --rounds 3 --lease-ms 2000 --json
//! ```

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distlock::{LockRegistry, Owner, RegistryOptions};
use distlock_bench::procstat::{listening_pid, process_tree_cpu_s, url_port};
use distlock_bench::spawn::{spawn, Target};
use serde::Serialize;

const USAGE: &str = "usage: election_bench (--backend URL | --spawn KIND) [--rounds N] \
                     [--lease-ms MS] [--candidates N] [--seconds S] [--json]";
const NAME: &str = "bench-election";

struct Args {
    target: Target,
    rounds: usize,
    lease: Duration,
    candidates: usize,
    seconds: f64,
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        target: Target::default(),
        rounds: 3,
        lease: Duration::from_millis(2000),
        candidates: 40,
        seconds: 3.0,
    };
    a.target = Target::parse(argv, "", |flag, value| {
        let bad = || format!("{flag}: bad value {value:?}");
        match flag {
            "--rounds" => a.rounds = value.parse().map_err(|_| bad())?,
            "--lease-ms" => a.lease = Duration::from_millis(value.parse().map_err(|_| bad())?),
            "--candidates" => a.candidates = value.parse().map_err(|_| bad())?,
            "--seconds" => a.seconds = value.parse().map_err(|_| bad())?,
            _ => return Err(format!("unknown flag {flag}")),
        }
        Ok(())
    })?;
    Ok(a)
}

#[derive(Serialize)]
struct Line<'a> {
    backend: &'a str,
    lease_ms: u128,
    rounds: usize,
    failover_ms_p50: f64,
    failover_ms_max: f64,
    handover_ms_p50: f64,
    handover_ms_max: f64,
    idle_candidates: usize,
    idle_client_cpu_us_per_candidate_s: f64,
    idle_server_cpu_us_per_candidate_s: Option<f64>,
}

async fn registry(url: &str, lease: Duration) -> LockRegistry {
    let options = RegistryOptions::default()
        .with_prefix("bench")
        .with_lease(lease);
    LockRegistry::connect(url, options)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// The child: leads, says so on stdout, and waits to be killed.
async fn child(url: &str, lease_ms: u64) {
    let reg = registry(url, Duration::from_millis(lease_ms)).await;
    let me = Owner::new(format!("bench-leader:{}", std::process::id())).unwrap();
    let leading = reg.election(NAME).unwrap().campaign(me).await.unwrap();
    println!("leading {}", leading.term());
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

fn p50_max(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

/// One failover: the child leads, a standby campaigns, the child is killed.
async fn failover(url: &str, lease: Duration) -> Duration {
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe().expect("this program"))
        .args(["--child-lead", url, &lease.as_millis().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the leader's process");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    tokio::task::block_in_place(|| out.read_line(&mut line)).expect("the leader's line");
    assert!(line.starts_with("leading"), "{line:?}");
    let standby = registry(url, lease).await;
    let election = standby.election(NAME).unwrap();
    let campaign = tokio::spawn(async move {
        let l = election
            .campaign(Owner::new("bench-standby").unwrap())
            .await
            .unwrap();
        (Instant::now(), l)
    });
    // The standby is waiting by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    child.kill().expect("kill -9 the leader");
    let _ = child.wait();
    let (led, leadership) = campaign.await.unwrap();
    leadership.resign().await.unwrap();
    led - killed
}

/// One hand-over: a leader resigns while a standby campaigns.
async fn handover(url: &str, lease: Duration) -> Duration {
    let (a, b) = (registry(url, lease).await, registry(url, lease).await);
    let leading = a
        .election(NAME)
        .unwrap()
        .campaign(Owner::new("bench-a").unwrap())
        .await
        .unwrap();
    let election = b.election(NAME).unwrap();
    let campaign = tokio::spawn(async move {
        let l = election
            .campaign(Owner::new("bench-b").unwrap())
            .await
            .unwrap();
        (Instant::now(), l)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resigned = Instant::now();
    leading.resign().await.unwrap();
    let (led, leadership) = campaign.await.unwrap();
    leadership.resign().await.unwrap();
    led - resigned
}

/// CPU of this process and of the server over `window`.
async fn cpu_over(window: Duration, server: Option<u32>) -> (f64, Option<f64>) {
    let (c0, s0) = (distlock_bench::cpu_s(), server.and_then(process_tree_cpu_s));
    tokio::time::sleep(window).await;
    let (c1, s1) = (distlock_bench::cpu_s(), server.and_then(process_tree_cpu_s));
    (c1 - c0, s0.zip(s1).map(|(a, b)| b - a))
}

/// Client and server CPU per idle candidate and second, in µs.
async fn idle(
    url: &str,
    lease: Duration,
    n: usize,
    window: Duration,
    server: Option<u32>,
) -> (f64, Option<f64>) {
    let leader = registry(url, lease).await;
    let leading = leader
        .election(NAME)
        .unwrap()
        .campaign(Owner::new("bench-leader").unwrap())
        .await
        .unwrap();
    let base = cpu_over(window, server).await;
    let mut campaigns = Vec::new();
    for i in 0..n {
        let reg = registry(url, lease).await;
        campaigns.push(tokio::spawn(async move {
            let e = reg.election(NAME).unwrap();
            let _ = e.campaign(Owner::new(format!("idle-{i}")).unwrap()).await;
        }));
    }
    // Settle: every candidate has made its first attempt.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let busy = cpu_over(window, server).await;
    for c in &campaigns {
        c.abort();
    }
    leading.resign().await.unwrap();
    let per = |b: f64, a: f64| ((a - b).max(0.0) * 1e6 / n as f64 / window.as_secs_f64()).round();
    (
        per(base.0, busy.0),
        base.1.zip(busy.1).map(|(b, a)| per(b, a)),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("--child-lead") {
        let lease: u64 = argv.get(2).and_then(|l| l.parse().ok()).expect("lease ms");
        child(&argv[1], lease).await;
        return;
    }
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let spawned = args
        .target
        .spawn
        .as_deref()
        .map(|k| spawn(k).unwrap_or_else(|e| panic!("{e}")));
    let url = spawned
        .as_ref()
        .map_or(args.target.backend.clone(), |s| s.url.clone());
    let server = spawned
        .as_ref()
        .and_then(|s| s.pid)
        .or_else(|| url_port(&url).and_then(listening_pid));
    let kind = distlock::connect(&url).await.expect("backend").kind();
    let mut failovers = Vec::new();
    let mut handovers = Vec::new();
    for _ in 0..args.rounds {
        failovers.push(ms(failover(&url, args.lease).await));
        handovers.push(ms(handover(&url, args.lease).await));
    }
    let window = Duration::from_secs_f64(args.seconds);
    let (client, server_cpu) = idle(&url, args.lease, args.candidates, window, server).await;
    let (f50, fmax) = p50_max(failovers);
    let (h50, hmax) = p50_max(handovers);
    let line = Line {
        backend: kind,
        lease_ms: args.lease.as_millis(),
        rounds: args.rounds,
        failover_ms_p50: f50,
        failover_ms_max: fmax,
        handover_ms_p50: h50,
        handover_ms_max: hmax,
        idle_candidates: args.candidates,
        idle_client_cpu_us_per_candidate_s: client,
        idle_server_cpu_us_per_candidate_s: server_cpu,
    };
    if args.target.json {
        distlock_bench::print_line(&line);
    } else {
        println!(
            "{kind}: lease {} ms; failover p50 {f50} ms (max {fmax}); resign hand-over p50 {h50} ms (max {hmax}); \
             idle candidate: {client} µs client CPU/s, {} µs server CPU/s",
            line.lease_ms,
            server_cpu.map_or_else(|| "?".to_string(), |s| s.to_string())
        );
    }
}
