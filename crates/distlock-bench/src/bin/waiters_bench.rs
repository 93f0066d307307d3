//! Many waiters on one key (`bench/waiters/run.sh`): W waiters queue for one key, each holder
//! releases at once and queues again, and the bench measures per hand-over the latency (from the
//! holder's release to the next holder's `lock()` returning), the server's CPU, the clients' CPU
//! and how many waiters were woken.
//!
//! ```text
//! waiters_bench --spawn redis --waiters 1000              # 1000 registries over 10 processes
//! waiters_bench --backend memory:// --waiters 1000 --shared  # 1000 tasks on one registry
//! ```
//!
//! In the spread layout every waiter is a registry of its own, as a service instance would be,
//! and the registries are spread over `--procs` worker processes (this program again, with
//! `--worker`). In the shared layout one worker process holds one registry and W tasks. Workers
//! stamp every hold with `CLOCK_MONOTONIC`, which all processes share. The holder increments a
//! counter file inside its critical section: the coordinator stops the run when the counter
//! reaches `--handoffs`, or at `--time`, and checks at the end that the counter equals the
//! number of holds (no two holders at once).
//!
//! Wake-ups are counted in the workers by a tracing subscriber that sees only the library's
//! `distlock.wait` span: one span per wait between two attempts, so a span that ends is one
//! waiter woken to make an attempt (or to take a lock handed to it). The span's polls count
//! the task's wake-ups, futile ones included. Every `lock()` future is also polled through a
//! counter: its polls after the first are the waiting task's wake-ups of any cause (a release
//! notification, a reply, a timer, the registry's local queue), which also covers the tasks
//! that share one registry and wait in its local queue rather than on the server.

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockRegistry, RegistryOptions};
use distlock_bench::only::{Hooks, Only};
use distlock_bench::procstat::{listening_pid, process_tree_cpu_s, url_port};
use distlock_bench::spawn::spawn;
use distlock_bench::{block_on, cpu_s, mono_ns, print_line, read_counter, ready, wait_for_start};
use serde::{Deserialize, Serialize};

const USAGE: &str =
    "usage: waiters_bench (--backend URL | --spawn KIND) --waiters W [--name NAME] \
                     [--procs N] [--shared] [--handoffs N] [--time SECS] [--max-poll SECS] \
                     [--query PARAMS] [--server-pid PID]";

/// The key every waiter queues for.
const KEY: &str = "waiters-bench";

#[derive(Debug)]
struct Args {
    backend: String,
    spawn: Option<String>,
    name: Option<String>,
    waiters: usize,
    procs: usize,
    shared: bool,
    handoffs: u64,
    time: f64,
    /// The registries' `max_poll_interval`, when given: a diagnostic that tells wake-ups by
    /// the poll fallback from wake-ups by notification.
    max_poll: Option<f64>,
    /// URL parameters added to the backend's URL (`hold_slice=0ms`).
    query: Option<String>,
    server_pid: Option<u32>,
    // Worker side.
    worker: bool,
    registries: usize,
    tasks: usize,
    counter: String,
}

impl Args {
    fn parse(argv: &[impl AsRef<str>]) -> Result<Args, String> {
        let mut a = Args {
            backend: String::new(),
            spawn: None,
            name: None,
            waiters: 10,
            procs: 10,
            shared: false,
            handoffs: 2000,
            time: 20.0,
            max_poll: None,
            query: None,
            server_pid: None,
            worker: false,
            registries: 1,
            tasks: 1,
            counter: String::new(),
        };
        let mut it = argv.iter().map(AsRef::as_ref);
        while let Some(flag) = it.next() {
            match flag {
                "--shared" => {
                    a.shared = true;
                    continue;
                }
                "--worker" => {
                    a.worker = true;
                    continue;
                }
                "-h" | "--help" => return Err(USAGE.into()),
                _ => {}
            }
            let v = it
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{flag} {v:?}: {e}");
            match flag {
                "--backend" => a.backend = v.to_owned(),
                "--spawn" => a.spawn = Some(v.to_owned()),
                "--name" => a.name = Some(v.to_owned()),
                "--waiters" => a.waiters = v.replace('_', "").parse().map_err(|e| bad(&e))?,
                "--procs" => a.procs = v.parse().map_err(|e| bad(&e))?,
                "--handoffs" => a.handoffs = v.parse().map_err(|e| bad(&e))?,
                "--time" => a.time = v.parse().map_err(|e| bad(&e))?,
                "--query" => a.query = Some(v.to_owned()),
                "--max-poll" => a.max_poll = Some(v.parse().map_err(|e| bad(&e))?),
                "--server-pid" => a.server_pid = Some(v.parse().map_err(|e| bad(&e))?),
                "--registries" => a.registries = v.parse().map_err(|e| bad(&e))?,
                "--tasks" => a.tasks = v.parse().map_err(|e| bad(&e))?,
                "--counter" => a.counter = v.to_owned(),
                other => return Err(format!("unknown option {other:?}\n{USAGE}")),
            }
        }
        if a.backend.is_empty() == a.spawn.is_none() {
            return Err(format!("one of --backend and --spawn is required\n{USAGE}"));
        }
        if a.waiters == 0 || a.procs == 0 || a.registries == 0 || a.tasks == 0 {
            return Err("--waiters, --procs, --registries and --tasks must be at least 1".into());
        }
        if !(a.time > 0.0 && a.time.is_finite()) {
            return Err(format!(
                "--time must be a positive number of seconds\n{USAGE}"
            ));
        }
        Ok(a)
    }
}

// ---------------------------------------------------------------------------------------------
// Wake-up counting

static STOPPED: AtomicBool = AtomicBool::new(false);
static WAITS_ENDED: AtomicU64 = AtomicU64::new(0);
static WAIT_CLONES: AtomicU64 = AtomicU64::new(0);
static WAIT_POLLS: AtomicU64 = AtomicU64::new(0);
static LOCK_CALLS: AtomicU64 = AtomicU64::new(0);
static LOCK_POLLS: AtomicU64 = AtomicU64::new(0);

const WAIT_SPAN: &str = "distlock.wait";

/// Sees the library's `distlock.wait` spans and nothing else; counts what happens to them
/// until the run stops.
struct WaitCounter;

impl Hooks for WaitCounter {
    fn wants(m: &tracing::Metadata<'_>) -> bool {
        m.is_span() && m.name() == WAIT_SPAN
    }
    fn enter(&self) {
        if !STOPPED.load(Ordering::Relaxed) {
            WAIT_POLLS.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn clone_span(&self) {
        WAIT_CLONES.fetch_add(1, Ordering::Relaxed);
    }
    fn close(&self) {
        // A wait that ends when the run stops is a cancelled wait, not a wake-up.
        if !STOPPED.load(Ordering::Relaxed) {
            WAITS_ENDED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Worker

/// A worker's result line.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerResult {
    ev: String,
    /// Every hold: lock() returned, release started, release returned (`CLOCK_MONOTONIC` ns),
    /// and the holding task.
    holds: Vec<[u64; 4]>,
    cpu_s: f64,
    /// `distlock.wait` spans that ended before the stop: waiters woken to attempt.
    waits: u64,
    /// Polls of those spans: task wake-ups, futile ones included.
    wait_polls: u64,
    /// Polls of `lock()` futures after their first, before the stop: every wake-up of a
    /// waiting task.
    lock_wakeups: u64,
    errors: u64,
    first_error: Option<String>,
}

async fn worker(a: Args) {
    let _ = tracing::subscriber::set_global_default(Only(WaitCounter));
    let mut locks = Vec::with_capacity(a.tasks);
    let mut registries = Vec::with_capacity(a.registries);
    for i in 0..a.registries {
        let mut opts = RegistryOptions::default();
        if let Some(p) = a.max_poll {
            opts = opts.with_max_poll_interval(Duration::from_secs_f64(p));
        }
        let reg = LockRegistry::connect(&a.backend, opts)
            .await
            .unwrap_or_else(|e| fail(&format!("registry {i}: {e}")));
        // Warm up: connections, scripts, tables, on a key of this registry's own.
        let warm = reg
            .obtain(&format!("{KEY}:warm:{}:{i}", std::process::id()))
            .unwrap_or_else(|e| fail(&format!("key: {e}")));
        match warm.try_lock().await {
            Ok(g) => g
                .release()
                .await
                .unwrap_or_else(|e| fail(&format!("warm-up release: {e}"))),
            Err(e) => fail(&format!("warm-up: {e}")),
        }
        registries.push(reg);
    }
    for t in 0..a.tasks {
        let reg = &registries[t % registries.len()];
        locks.push(
            reg.obtain(KEY)
                .unwrap_or_else(|e| fail(&format!("key: {e}"))),
        );
    }
    ready("distlock");
    wait_for_start();
    let cpu0 = cpu_s();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let cpu_at_stop = Arc::new(std::sync::Mutex::new(None::<f64>));
    {
        let cpu_at_stop = cpu_at_stop.clone();
        // The coordinator's `stop` line, or its end (EOF), or a deadline of our own.
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
            *cpu_at_stop.lock().expect("cpu") = Some(cpu_s());
            STOPPED.store(true, Ordering::Relaxed);
            let _ = stop_tx.send(true);
        });
    }
    let hard_end = tokio::time::Instant::now() + Duration::from_secs_f64(a.time + 30.0);
    let counter = Arc::new(a.counter.clone());
    let mut tasks = tokio::task::JoinSet::new();
    for (task, lock) in locks.into_iter().enumerate() {
        let mut stop = stop_rx.clone();
        let counter = counter.clone();
        tasks.spawn(async move {
            let mut holds = Vec::new();
            let (mut errors, mut first_error) = (0u64, None::<String>);
            loop {
                let acquiring = lock.lock();
                tokio::pin!(acquiring);
                LOCK_CALLS.fetch_add(1, Ordering::Relaxed);
                let counted = std::future::poll_fn(|cx| {
                    if !STOPPED.load(Ordering::Relaxed) {
                        LOCK_POLLS.fetch_add(1, Ordering::Relaxed);
                    }
                    acquiring.as_mut().poll(cx)
                });
                let guard = tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep_until(hard_end) => break,
                    r = counted => r,
                };
                let guard = match guard {
                    Ok(g) => g,
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("lock: {e}"));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let t1 = mono_ns();
                let n = read_counter(&counter) + 1;
                std::fs::write(&*counter, n.to_string()).expect("counter file");
                // Hold across an await, so that the other tasks of this process run and queue
                // (on one thread they would otherwise only ever find the lock free).
                tokio::task::yield_now().await;
                let t2 = mono_ns();
                if let Err(e) = guard.release().await {
                    errors += 1;
                    first_error.get_or_insert_with(|| format!("release: {e}"));
                }
                holds.push([t1, t2, mono_ns(), task as u64]);
                // A released task lets the others run before it queues again, as a service
                // would do other work: on one thread it could otherwise take the lock back
                // before any other task has asked for it.
                tokio::task::yield_now().await;
            }
            (holds, errors, first_error)
        });
    }
    let mut result = WorkerResult {
        ev: "result".into(),
        holds: Vec::new(),
        cpu_s: 0.0,
        waits: 0,
        wait_polls: 0,
        lock_wakeups: 0,
        errors: 0,
        first_error: None,
    };
    while let Some(r) = tasks.join_next().await {
        let (holds, errors, first_error) = r.unwrap_or_else(|e| fail(&format!("task: {e}")));
        result.holds.extend(holds);
        result.errors += errors;
        if result.first_error.is_none() {
            result.first_error = first_error;
        }
    }
    let cpu1 = cpu_at_stop.lock().expect("cpu").unwrap_or_else(cpu_s);
    result.cpu_s = cpu1 - cpu0;
    result.waits = WAITS_ENDED
        .load(Ordering::Relaxed)
        .saturating_sub(WAIT_CLONES.load(Ordering::Relaxed));
    result.wait_polls = WAIT_POLLS.load(Ordering::Relaxed);
    result.lock_wakeups = LOCK_POLLS
        .load(Ordering::Relaxed)
        .saturating_sub(LOCK_CALLS.load(Ordering::Relaxed));
    print_line(&result);
    // Queue entries left by the cancelled waits are the server's to clean up; do not wait.
    std::process::exit(0);
}

fn fail(msg: &str) -> ! {
    eprintln!("waiters_bench: {msg}");
    std::process::exit(1)
}

// ---------------------------------------------------------------------------------------------
// Coordinator

/// One line of `bench/waiters/run.sh`'s output.
#[derive(Debug, Serialize)]
struct Report {
    backend: String,
    waiters: usize,
    handoff_p50_us: Option<f64>,
    handoff_p99_us: Option<f64>,
    server_cpu_us_per_handoff: Option<f64>,
    client_cpu_us_per_handoff: Option<f64>,
    /// Wake-ups of waiting tasks (polls of `lock()` futures after their first), per hand-over.
    wakeups_per_handoff: Option<f64>,
    layout: &'static str,
    /// `--max-poll`, when given (else the library's default).
    max_poll_s: Option<f64>,
    /// `--query`, when given.
    query: Option<String>,
    procs: usize,
    handoffs: usize,
    /// Holds that followed the same holder's own (not hand-overs; they cost CPU too, which the
    /// figures per hand-over include).
    reacquired: usize,
    seconds: f64,
    /// Waits that ended in an attempt (or a lock handed over), per hand-over.
    attempts_per_handoff: Option<f64>,
    /// Polls of those waits (wake-ups of a waiting task inside the wait), per hand-over.
    wait_polls_per_handoff: Option<f64>,
    exclusive: bool,
    errors: u64,
    first_error: Option<String>,
    server_pid: Option<u32>,
    loadavg: String,
    /// Connections the throwaway Redis refused (`maxclients`), the workers' start-up included:
    /// a refused registry waits without notifications.
    server_refused_connections: Option<u64>,
}

struct WorkerProc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
}

impl WorkerProc {
    fn line(&mut self) -> Option<String> {
        let mut s = String::new();
        match self.stdout.read_line(&mut s) {
            Ok(n) if n > 0 => Some(s),
            _ => None,
        }
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percentile(sorted: &[u64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[i] as f64 / 1e3)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A connection to the throwaway Redis, opened before the workers: a server that has reached
/// `maxclients` refuses every later one, this one included.
#[cfg(feature = "redis")]
struct RedisAdmin(redis::Connection);

#[cfg(feature = "redis")]
impl RedisAdmin {
    fn connect(url: &str) -> Option<RedisAdmin> {
        let con = redis::Client::open(url).ok()?.get_connection().ok()?;
        con.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        Some(RedisAdmin(con))
    }

    /// Lets the server take a client per waiter and one for its notifications, as far as the
    /// open-file limit it inherited allows (Redis keeps 32 descriptors for itself; Redis's
    /// default is 10,000 clients): the spread layout holds two connections per registry.
    fn raise_maxclients(&mut self) {
        let limit = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                let line = l
                    .lines()
                    .find(|l| l.starts_with("Max open files"))?
                    .to_owned();
                line.split_whitespace().nth(3)?.parse::<u64>().ok()
            })
            .unwrap_or(19_032);
        let _: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxclients")
            .arg(limit.saturating_sub(32))
            .query(&mut self.0);
    }

    /// Connections the server refused so far (`maxclients` reached).
    fn refused(&mut self) -> Option<u64> {
        let info: String = redis::cmd("INFO").arg("stats").query(&mut self.0).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("rejected_connections:"))?
            .trim()
            .parse()
            .ok()
    }
}

/// Without the `redis` feature there is no throwaway Redis to administer.
#[cfg(not(feature = "redis"))]
struct RedisAdmin;

#[cfg(not(feature = "redis"))]
impl RedisAdmin {
    fn connect(_: &str) -> Option<RedisAdmin> {
        None
    }
    fn raise_maxclients(&mut self) {}
    fn refused(&mut self) -> Option<u64> {
        None
    }
}

/// The counter file's directory, removed however the run ends.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn coordinate(mut a: Args) -> Result<Report, String> {
    let spawned = match &a.spawn {
        Some(kind) => Some(spawn(kind)?),
        None => None,
    };
    if let Some(s) = &spawned {
        a.backend = s.url.clone();
        a.server_pid = a.server_pid.or(s.pid);
    }
    if let Some(q) = &a.query {
        let sep = if a.backend.contains('?') { '&' } else { '?' };
        a.backend = format!("{}{sep}{q}", a.backend);
    }
    let server_pid = a
        .server_pid
        .or_else(|| url_port(&a.backend).and_then(listening_pid));
    let mut admin = match a.spawn.as_deref() {
        Some("redis") => RedisAdmin::connect(&a.backend),
        _ => None,
    };
    if let (Some(admin), true) = (admin.as_mut(), a.waiters > 4000) {
        admin.raise_maxclients();
    }
    let name = a
        .name
        .clone()
        .or_else(|| a.spawn.clone())
        .unwrap_or_else(|| a.backend.split("://").next().unwrap_or("").to_owned());
    let dir = Scratch(std::env::temp_dir().join(format!("waiters-bench-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).map_err(|e| format!("{}: {e}", dir.0.display()))?;
    let counter = dir.0.join("counter");
    std::fs::write(&counter, "0").map_err(|e| format!("{}: {e}", counter.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;

    // (registries, tasks) per worker process.
    let plan: Vec<(usize, usize)> = if a.shared {
        vec![(1, a.waiters)]
    } else {
        let procs = a.procs.min(a.waiters);
        (0..procs)
            .map(|i| {
                let n = a.waiters / procs + usize::from(i < a.waiters % procs);
                (n, n)
            })
            .collect()
    };
    let mut workers = Vec::new();
    for (registries, tasks) in &plan {
        let mut child = Command::new(&exe)
            .args(["--worker", "--backend", &a.backend])
            .args(["--registries", &registries.to_string()])
            .args(["--tasks", &tasks.to_string()])
            .args(["--time", &a.time.to_string()])
            .args(["--counter", &counter.to_string_lossy()])
            .args(
                a.max_poll
                    .iter()
                    .flat_map(|p| ["--max-poll".to_owned(), p.to_string()]),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting a worker: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        workers.push(WorkerProc {
            child,
            stdin,
            stdout,
        });
    }
    // Bounded by the workers' exit: a worker that fails prints nothing and ends.
    for w in &mut workers {
        match w.line() {
            Some(l) if l.contains("\"ready\"") => {}
            other => return Err(format!("a worker did not get ready: {other:?}")),
        }
    }
    let start = mono_ns() + 200_000_000;
    for w in &mut workers {
        let stdin = w.stdin.as_mut().expect("stdin");
        writeln!(stdin, "start {start}").map_err(|e| format!("worker stdin: {e}"))?;
        stdin.flush().map_err(|e| e.to_string())?;
    }
    while mono_ns() < start {
        std::thread::sleep(Duration::from_millis(1));
    }
    let server0 = server_pid.and_then(process_tree_cpu_s);
    let t0 = Instant::now();
    let limit = Duration::from_secs_f64(a.time);
    while t0.elapsed() < limit && read_counter(&counter.to_string_lossy()) < a.handoffs + 1 {
        std::thread::sleep(Duration::from_millis(20));
    }
    for w in &mut workers {
        // Closing stdin is the stop.
        w.stdin.take();
    }
    let stop = mono_ns();
    let seconds = t0.elapsed().as_secs_f64();
    let server1 = server_pid.and_then(process_tree_cpu_s);
    let refused = admin.as_mut().and_then(RedisAdmin::refused);

    let mut holds = Vec::new();
    let (mut client_cpu, mut waits, mut polls, mut errors) = (0.0, 0u64, 0u64, 0u64);
    let mut lock_wakeups = 0u64;
    let mut first_error = None;
    for (i, w) in workers.iter_mut().enumerate() {
        let line = w.line().ok_or("a worker ended without its result")?;
        let r: WorkerResult = serde_json::from_str(&line).map_err(|e| e.to_string())?;
        // Holders are numbered across workers.
        let base = (i as u64) << 32;
        holds.extend(r.holds.into_iter().map(|[a, b, c, t]| [a, b, c, base | t]));
        client_cpu += r.cpu_s;
        waits += r.waits;
        polls += r.wait_polls;
        lock_wakeups += r.lock_wakeups;
        errors += r.errors;
        if first_error.is_none() {
            first_error = r.first_error;
        }
    }
    let exclusive = read_counter(&counter.to_string_lossy()) == holds.len() as u64;
    drop(workers);
    drop(spawned);

    holds.sort_unstable_by_key(|h| h[0]);
    let mut lat = Vec::with_capacity(holds.len());
    let mut exclusive = exclusive;
    let mut reacquired = 0usize;
    for pair in holds.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        // The next holder's lock() returned before the previous holder began to release.
        exclusive &= next[0] >= prev[1];
        if next[0] > stop {
            continue;
        }
        // Only a change of holder is a hand-over.
        if next[3] == prev[3] {
            reacquired += 1;
        } else {
            lat.push(next[0].saturating_sub(prev[1]));
        }
    }
    lat.sort_unstable();
    let n = lat.len();
    let per = |x: f64| (n > 0).then(|| (x / n as f64 * 100.0).round() / 100.0);
    Ok(Report {
        backend: name,
        waiters: a.waiters,
        handoff_p50_us: percentile(&lat, 0.5),
        handoff_p99_us: percentile(&lat, 0.99),
        server_cpu_us_per_handoff: server0
            .zip(server1)
            .and_then(|(c0, c1)| per((c1 - c0) * 1e6)),
        client_cpu_us_per_handoff: per(client_cpu * 1e6),
        wakeups_per_handoff: per(lock_wakeups as f64),
        layout: if a.shared { "shared" } else { "spread" },
        max_poll_s: a.max_poll,
        query: a.query.clone(),
        procs: plan.len(),
        handoffs: n,
        reacquired,
        seconds: (seconds * 100.0).round() / 100.0,
        attempts_per_handoff: per(waits as f64),
        wait_polls_per_handoff: per(polls as f64),
        exclusive,
        errors,
        first_error,
        server_pid,
        loadavg: loadavg(),
        server_refused_connections: refused,
    })
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = Args::parse(&argv).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    if a.worker {
        block_on(worker(a));
        return;
    }
    match coordinate(a) {
        Ok(r) => print_line(&r),
        Err(e) => fail(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_their_errors() {
        let a = Args::parse(&["--spawn", "redis", "--waiters", "10_000", "--shared"]).unwrap();
        assert_eq!((a.waiters, a.shared, a.procs), (10_000, true, 10));
        assert!(Args::parse(&["--waiters", "10"]).is_err());
        assert!(Args::parse(&["--backend", "memory://", "--waiters", "0"]).is_err());
        assert!(Args::parse(&["--backend", "memory://", "--time", "-1"]).is_err());
        assert!(Args::parse(&["--backend", "memory://", "--nope", "1"]).is_err());
        assert!(Args::parse(&["--backend", "memory://", "--waiters"]).is_err());
    }

    #[test]
    fn percentiles_of_sorted_latencies() {
        assert_eq!(percentile(&[], 0.5), None);
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile(&v, 0.5), Some(51.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
    }
}
