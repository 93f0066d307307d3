//! What the benchmark workers (`sql_bench_worker`, `zk_bench_worker`, `etcd_bench_worker`)
//! share: the worker protocol of `../shared/bench/other-backends` (a ready line, a common start
//! instant on stdin, one result line of JSON) and the two measured loops.
#![allow(dead_code)] // each worker uses its own subset

use std::io::{BufRead, Write};
use std::time::Duration;

/// `CLOCK_MONOTONIC` in ns: the clock the harness and every worker share.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time of this process (user + system), in seconds.
pub fn cpu_s() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The flat JSON object of `--params`: string and number values only.
pub fn parse_params(json: &str) -> Vec<(String, String)> {
    let body = json.trim().trim_start_matches('{').trim_end_matches('}');
    body.split(',')
        .filter_map(|item| item.split_once(':'))
        .map(|(k, v)| {
            let unq = |s: &str| s.trim().trim_matches('"').to_owned();
            (unq(k), unq(v))
        })
        .collect()
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn read_counter(path: &str) -> u64 {
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
    println!(
        r#"{{"ev":"ready","ready_ns":{},"pid":{},"client":{}}}"#,
        mono_ns(),
        std::process::id(),
        json_str(client)
    );
    std::io::stdout().flush().unwrap();
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
        let lats: Vec<String> = self.lat.iter().map(u64::to_string).collect();
        println!(
            r#"{{"ev":"result","lat_ns":[{}],"ops":{},"start_ns":{},"finished_ns":{},"cpu_s":{cpu:.4},"errors":0,"first_error":null,"proc_id":{proc_id},"pid":{},"extra":{{}},"round_trips":null}}"#,
            lats.join(","),
            self.lat.len(),
            self.start,
            self.now,
            std::process::id()
        );
        std::io::stdout().flush().unwrap();
    }
}

/// S1/S2: reports ready, then from the common start for `duration` seconds locks, runs the
/// critical section (with `counter_file`: read the counter, write it plus one) and releases,
/// and prints every cycle's four instants.
pub async fn measure_cycles(
    lock: &distlock::Lock,
    client: &str,
    duration: f64,
    proc_id: u64,
    counter_file: Option<&str>,
    round_trips: u32,
) {
    ready(client);
    let start = wait_for_start();
    let end = start + (duration * 1e9) as u64;
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
        if let Some(path) = counter_file {
            write_counter(path, read_counter(path) + 1);
        }
        let t2 = mono_ns();
        if let Err(e) = guard.release().await {
            errors += 1;
            first_error.get_or_insert_with(|| format!("release: {e}"));
        }
        let t3 = mono_ns();
        cycles.push([t0, t1, t2, t3]);
    }
    let cpu = cpu_s() - cpu0;
    let cycles: Vec<String> = cycles
        .iter()
        .map(|c| format!("[{},{},{},{}]", c[0], c[1], c[2], c[3]))
        .collect();
    let first_error = first_error.as_deref().map_or("null".to_owned(), json_str);
    println!(
        r#"{{"ev":"result","cycles":[{}],"start_ns":{start},"end_ns":{end},"finished_ns":{},"cpu_s":{cpu:.4},"errors":{errors},"first_error":{first_error},"proc_id":{proc_id},"pid":{},"extra":{{}},"round_trips":{round_trips}}}"#,
        cycles.join(","),
        mono_ns(),
        std::process::id()
    );
    std::io::stdout().flush().unwrap();
}
