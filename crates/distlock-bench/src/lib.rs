//! What distlock's benchmark processes share: the shared clock, the JSON lines they print, and
//! for the workers of `bench/{sql,zookeeper,etcd}` (`sql_bench_worker`, `zk_bench_worker`,
//! `etcd_bench_worker`) the worker protocol of the other-backends harness (a ready line,
//! a common start instant on stdin, one result line) with its flags and its two measured loops.
//! `bench_adapter` speaks the adapter contract of the Redis lock harness instead; it uses the
//! clock and [`AdapterCycle`] / [`AdapterSummary`] from here.
//!
//! Every protocol line is a `Serialize` struct printed by serde_json; the field names and their
//! order are the ones the external harnesses parse.

#[cfg(any(feature = "sql", feature = "waiters"))]
pub mod only;
#[cfg(feature = "sql")]
pub mod probe;
pub mod procstat;
#[cfg(feature = "scale")]
pub mod spawn;

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};
use nix::time::{clock_gettime, ClockId};
use serde::Serialize;

/// `CLOCK_MONOTONIC` in ns: the clock the harness and every worker share (`std::time::Instant`
/// cannot be compared across processes).
pub fn mono_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}

/// CPU time of this process (user + system), in seconds.
pub fn cpu_s() -> f64 {
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return 0.0;
    };
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(ru.user_time()) + t(ru.system_time())
}

/// Seconds rounded to 0.1 ms, as the workers have always reported `cpu_s`.
fn round4(s: f64) -> f64 {
    (s * 1e4).round() / 1e4
}

/// Writes `line` as one line of JSON.
pub fn write_line<W: Write, T: Serialize>(out: &mut W, line: &T) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")
}

/// Writes one JSON line to stdout and flushes.
pub fn print_line<T: Serialize>(line: &T) {
    let mut out = std::io::stdout().lock();
    write_line(&mut out, line).expect("stdout");
    out.flush().expect("stdout");
}

// ---------------------------------------------------------------------------------------------
// The adapter contract of the Redis lock harness (`bench_adapter`)

/// `{"ev":"cycle",...}`: one acquire/release cycle of worker `w`, the instants `t0..t3`.
#[derive(Debug, Serialize)]
pub struct AdapterCycle {
    pub ev: &'static str,
    pub w: usize,
    pub t: [u64; 4],
}

impl AdapterCycle {
    pub fn new(w: usize, t: [u64; 4]) -> Self {
        AdapterCycle { ev: "cycle", w, t }
    }
}

/// `{"ev":"summary",...}`: the adapter's last line.
#[derive(Debug, Serialize)]
pub struct AdapterSummary<'a> {
    pub ev: &'static str,
    pub lib: &'a str,
    pub lib_version: &'a str,
    pub variant: &'a str,
    pub wait_strategy: &'a str,
    pub scenario: &'a str,
    pub proc_id: u64,
    pub pid: u32,
    pub workers: usize,
    pub cycles: u64,
    pub errors: u64,
    pub first_error: Option<&'a str>,
    pub ready_ns: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub finished_ns: u64,
}

// ---------------------------------------------------------------------------------------------
// The worker protocol of the other-backends harness (the three workers)

/// `{"ev":"ready",...}`: warmed up, waiting for the start line.
#[derive(Debug, Serialize)]
struct Ready<'a> {
    ev: &'static str,
    ready_ns: u64,
    pid: u32,
    client: &'a str,
}

/// `{}`: the `extra` field of a result, unused by these workers.
#[derive(Debug, Serialize)]
struct NoExtra {}

/// The fields every result ends with, in the harness's order.
#[derive(Debug, Serialize)]
struct RunEnd {
    finished_ns: u64,
    cpu_s: f64,
    errors: u64,
    first_error: Option<String>,
    proc_id: u64,
    pid: u32,
    extra: NoExtra,
}

impl RunEnd {
    /// This process's end of a run that used `cpu` seconds of CPU.
    fn new(
        finished_ns: u64,
        cpu: f64,
        errors: u64,
        first_error: Option<String>,
        proc_id: u64,
    ) -> Self {
        RunEnd {
            finished_ns,
            cpu_s: round4(cpu),
            errors,
            first_error,
            proc_id,
            pid: std::process::id(),
            extra: NoExtra {},
        }
    }
}

/// The result of a baseline run: every operation's latency.
#[derive(Debug, Serialize)]
struct OpsResult {
    ev: &'static str,
    lat_ns: Vec<u64>,
    ops: usize,
    start_ns: u64,
    #[serde(flatten)]
    end: RunEnd,
    round_trips: Option<u32>,
}

/// The result of an S1/S2 run: every cycle's four instants.
#[derive(Debug, Serialize)]
struct CyclesResult {
    ev: &'static str,
    cycles: Vec<[u64; 4]>,
    start_ns: u64,
    end_ns: u64,
    #[serde(flatten)]
    end: RunEnd,
    round_trips: u32,
}

/// The flags the harness gives a worker (`worker.py`'s flags).
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// `--backend`: `pg`, `mariadb`, `zk`, `etcd`.
    pub backend: String,
    /// `--params`: the JSON connection parameters, values as text.
    pub params: HashMap<String, String>,
    /// `--mode`: `baseline`, `S1` or `S2`.
    pub mode: String,
    /// `--op` of a baseline: `read` or `write`.
    pub op: String,
    /// `--recipe`: `distlock` or `distlock-spring` (SQL).
    pub recipe: String,
    pub key: String,
    pub duration: f64,
    pub proc_id: u64,
    pub counter_file: String,
    pub warmup: u64,
}

impl WorkerArgs {
    /// Parses `std::env::args()`; exits with status 2 on a bad flag.
    pub fn from_env() -> WorkerArgs {
        let argv: Vec<String> = std::env::args().skip(1).collect();
        WorkerArgs::parse(&argv).unwrap_or_else(|e| {
            eprintln!("bench worker: {e}");
            std::process::exit(2)
        })
    }

    /// Parses `--flag value` pairs.
    pub fn parse(argv: &[impl AsRef<str>]) -> Result<WorkerArgs, String> {
        let mut a = WorkerArgs {
            backend: String::new(),
            params: HashMap::new(),
            mode: "S1".into(),
            op: "write".into(),
            recipe: "distlock".into(),
            key: "bench-key".into(),
            duration: 5.0,
            proc_id: 0,
            counter_file: String::new(),
            warmup: 50,
        };
        for pair in argv.chunks(2) {
            let flag = pair[0].as_ref();
            let v = pair
                .get(1)
                .map(|v| v.as_ref().to_owned())
                .ok_or_else(|| format!("missing value for {flag}"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{flag} {v:?}: {e}");
            match flag {
                "--backend" => a.backend = v,
                "--params" => a.params = parse_params(&v).map_err(|e| bad(&e))?,
                "--mode" => a.mode = v,
                "--op" => a.op = v,
                "--recipe" => a.recipe = v,
                "--variant" => {}
                "--key" => a.key = v,
                "--duration" => a.duration = v.parse().map_err(|e| bad(&e))?,
                "--proc-id" => a.proc_id = v.parse().map_err(|e| bad(&e))?,
                "--counter-file" => a.counter_file = v,
                "--warmup" => a.warmup = v.parse().map_err(|e| bad(&e))?,
                other => return Err(format!("unknown flag {other}")),
            }
        }
        Ok(a)
    }

    /// A connection parameter, or `""`.
    pub fn param(&self, name: &str) -> &str {
        self.params.get(name).map_or("", String::as_str)
    }

    /// The counter file of S2, `None` in S1.
    pub fn counter(&self) -> Option<&str> {
        (self.mode == "S2").then_some(self.counter_file.as_str())
    }
}

/// The flat JSON object of `--params`, string and number values as text.
pub fn parse_params(json: &str) -> Result<HashMap<String, String>, serde_json::Error> {
    let map: HashMap<String, serde_json::Value> = serde_json::from_str(json)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect())
}

/// The number in the counter file at `path`, 0 when it is missing or unreadable.
pub fn read_counter(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn write_counter(path: &str, v: u64) {
    std::fs::write(path, v.to_string()).expect("counter file");
}

/// Tells the harness this worker is warmed up.
pub fn ready(client: &str) {
    print_line(&Ready {
        ev: "ready",
        ready_ns: mono_ns(),
        pid: std::process::id(),
        client,
    });
}

/// Waits for the harness's `start <ns>` line, then until that instant; returns the start.
pub fn wait_for_start() -> u64 {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
    let mut parts = line.split_whitespace();
    let start = match (parts.next(), parts.next()) {
        (Some("start"), Some(ns)) => ns.parse().unwrap_or_else(|_| mono_ns()),
        _ => mono_ns(),
    };
    while mono_ns() < start {
        let rem = start.saturating_sub(mono_ns());
        if rem > 2_000_000 {
            std::thread::sleep(Duration::from_nanos(rem - 1_000_000));
        }
    }
    mono_ns()
}

/// Baseline timing: [`start`](Self::start) reports ready and waits for the common start; the
/// caller runs its operation back to back `while timer.running()`, calling
/// [`tick`](Self::tick) after each; [`finish`](Self::finish) prints every latency.
pub struct OpTimer {
    start: u64,
    end: u64,
    now: u64,
    cpu0: f64,
    lat: Vec<u64>,
}

impl OpTimer {
    pub fn start(client: &str, duration: f64) -> OpTimer {
        ready(client);
        let start = wait_for_start();
        OpTimer {
            start,
            end: start + (duration * 1e9) as u64,
            now: start,
            cpu0: cpu_s(),
            lat: Vec::with_capacity(200_000),
        }
    }

    pub fn running(&self) -> bool {
        self.now < self.end
    }

    pub fn tick(&mut self) {
        let t = mono_ns();
        self.lat.push(t - self.now);
        self.now = t;
    }

    pub fn finish(self, proc_id: u64) {
        let cpu = cpu_s() - self.cpu0;
        print_line(&OpsResult {
            ev: "result",
            ops: self.lat.len(),
            lat_ns: self.lat,
            start_ns: self.start,
            end: RunEnd::new(self.now, cpu, 0, None, proc_id),
            round_trips: None,
        });
    }
}

/// Runs a baseline: `warmup` unmeasured operations, then `op` back to back from the common
/// start for `duration` seconds, and prints every latency.
pub async fn measure_ops<F: AsyncFnMut()>(
    mut op: F,
    client: &str,
    duration: f64,
    proc_id: u64,
    warmup: u64,
) {
    for _ in 0..warmup {
        op().await;
    }
    let mut timer = OpTimer::start(client, duration);
    while timer.running() {
        op().await;
        timer.tick();
    }
    timer.finish(proc_id);
}

/// S1/S2: `warmup` cycles on the private key `<key>:warmup:<proc_id>`, then reports ready and
/// from the common start for `duration` seconds locks `key`, runs the critical section (in S2:
/// read the counter file, write it plus one) and releases, and prints every cycle's four
/// instants.
pub async fn measure_cycles(
    registry: &distlock::LockRegistry,
    a: &WorkerArgs,
    client: &str,
    round_trips: u32,
) {
    let warm = registry
        .obtain(&format!("{}:warmup:{}", a.key, a.proc_id))
        .expect("warm-up key");
    for _ in 0..a.warmup {
        warm.lock()
            .await
            .expect("warm-up lock")
            .release()
            .await
            .expect("warm-up release");
    }
    let lock = registry.obtain(&a.key).expect("key");
    let counter_file = a.counter();
    ready(client);
    let start = wait_for_start();
    let end = start + (a.duration * 1e9) as u64;
    let cpu0 = cpu_s();
    let mut cycles: Vec<[u64; 4]> = Vec::with_capacity(100_000);
    let (mut errors, mut first_error) = (0u64, None::<String>);
    loop {
        let t0 = mono_ns();
        if t0 >= end {
            break;
        }
        let guard = match lock.lock().await {
            Ok(g) => g,
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("acquire: {e}"));
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        let t1 = mono_ns();
        #[cfg(feature = "sql")]
        probe::mark("acquired");
        if let Some(path) = counter_file {
            write_counter(path, read_counter(path) + 1);
        }
        let t2 = mono_ns();
        #[cfg(feature = "sql")]
        probe::mark("release");
        if let Err(e) = guard.release().await {
            errors += 1;
            first_error.get_or_insert_with(|| format!("release: {e}"));
        }
        let t3 = mono_ns();
        #[cfg(feature = "sql")]
        probe::mark("released");
        cycles.push([t0, t1, t2, t3]);
    }
    let cpu = cpu_s() - cpu0;
    #[cfg(feature = "sql")]
    probe::dump(a.proc_id);
    print_line(&CyclesResult {
        ev: "result",
        cycles,
        start_ns: start,
        end_ns: end,
        end: RunEnd::new(mono_ns(), cpu, errors, first_error, a.proc_id),
        round_trips,
    });
}

/// A worker's `main` for the harness's two kinds of run: `baseline` when `--mode baseline`,
/// else `cycles`, on [`block_on`]'s runtime.
pub fn run_worker<B, C>(
    baseline: impl FnOnce(WorkerArgs) -> B,
    cycles: impl FnOnce(WorkerArgs) -> C,
) where
    B: std::future::Future<Output = ()>,
    C: std::future::Future<Output = ()>,
{
    let a = WorkerArgs::from_env();
    if a.mode == "baseline" {
        block_on(baseline(a))
    } else {
        block_on(cycles(a))
    }
}

/// A current-thread runtime running `f` to the end: every worker's `main`.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_flags_and_params() {
        let a = WorkerArgs::parse(&[
            "--backend",
            "pg",
            "--params",
            r#"{"host": "127.0.0.1", "port": 5432, "user": "bench"}"#,
            "--mode",
            "S2",
            "--counter-file",
            "/tmp/c",
            "--proc-id",
            "3",
            "--duration",
            "0.5",
            "--variant",
            "",
        ])
        .unwrap();
        assert_eq!(a.param("host"), "127.0.0.1");
        assert_eq!(a.param("port"), "5432");
        assert_eq!(a.param("dbname"), "");
        assert_eq!((a.proc_id, a.duration), (3, 0.5));
        assert_eq!(a.counter(), Some("/tmp/c"));
        assert!(WorkerArgs::parse(&["--nope", "1"]).is_err());
        assert!(WorkerArgs::parse(&["--duration"]).is_err());
        assert!(WorkerArgs::parse(&["--params", "{"]).is_err());
    }

    #[test]
    fn protocol_lines_keep_their_field_names_and_order() {
        let s = serde_json::to_string(&OpsResult {
            ev: "result",
            lat_ns: vec![1, 2],
            ops: 2,
            start_ns: 10,
            end: RunEnd {
                pid: 7,
                ..RunEnd::new(20, 0.123_456, 0, None, 0)
            },
            round_trips: None,
        })
        .unwrap();
        assert_eq!(
            s,
            r#"{"ev":"result","lat_ns":[1,2],"ops":2,"start_ns":10,"finished_ns":20,"cpu_s":0.1235,"errors":0,"first_error":null,"proc_id":0,"pid":7,"extra":{},"round_trips":null}"#
        );
        let s = serde_json::to_string(&CyclesResult {
            ev: "result",
            cycles: vec![[1, 2, 3, 4]],
            start_ns: 1,
            end_ns: 9,
            end: RunEnd {
                pid: 7,
                ..RunEnd::new(5, 0.0, 1, Some("acquire: \"x\"\n".into()), 1)
            },
            round_trips: 2,
        })
        .unwrap();
        assert_eq!(
            s,
            r#"{"ev":"result","cycles":[[1,2,3,4]],"start_ns":1,"end_ns":9,"finished_ns":5,"cpu_s":0.0,"errors":1,"first_error":"acquire: \"x\"\n","proc_id":1,"pid":7,"extra":{},"round_trips":2}"#
        );
        assert_eq!(
            serde_json::to_string(&AdapterCycle::new(3, [1, 2, 3, 4])).unwrap(),
            r#"{"ev":"cycle","w":3,"t":[1,2,3,4]}"#
        );
        assert_eq!(
            serde_json::to_string(&Ready {
                ev: "ready",
                ready_ns: 1,
                pid: 2,
                client: "c"
            })
            .unwrap(),
            r#"{"ev":"ready","ready_ns":1,"pid":2,"client":"c"}"#
        );
    }

    #[test]
    fn the_clock_is_monotonic() {
        let a = mono_ns();
        assert!(mono_ns() >= a && a > 0);
        assert!(cpu_s() >= 0.0);
    }
}
