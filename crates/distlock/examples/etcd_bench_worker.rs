//! One measuring process for the etcd lock benchmark (`bench/etcd/run.sh`), speaking the worker
//! protocol of `../shared/bench/other-backends/worker.py`, so that the shared harness's analysis
//! applies unchanged:
//!
//! 1. connect, warm up on a private key, print `{"ev":"ready",...}`;
//! 2. read `start <CLOCK_MONOTONIC ns>` from stdin and wait until then;
//! 3. loop for `--duration` seconds, timestamps in memory only;
//! 4. print `{"ev":"result",...}` and exit 0.
//!
//! Modes: `baseline` (`--op read|write`: a range or a put of one key through `etcd-client`, the
//! gRPC client distlock uses), `S1` (acquire + release), `S2` (acquire, read and write the
//! counter file, release). `--recipe distlock` (a `LockRegistry` over `EtcdBackend`);
//! `--params` is the harness's JSON connection parameters (`{"host": .., "port": ..}`).
//!
//! `cargo build --release -p distlock --features etcd --example etcd_bench_worker`.

use std::io::{BufRead, Write};
use std::time::Duration;

use distlock::backends::etcd::EtcdBackend;
use distlock::{LockRegistry, RegistryOptions};

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn cpu_s() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The flat JSON object of `--params`: string and number values only.
fn parse_params(json: &str) -> Vec<(String, String)> {
    let body = json.trim().trim_start_matches('{').trim_end_matches('}');
    body.split(',')
        .filter_map(|item| item.split_once(':'))
        .map(|(k, v)| {
            let unq = |s: &str| s.trim().trim_matches('"').to_owned();
            (unq(k), unq(v))
        })
        .collect()
}

struct Args {
    params: Vec<(String, String)>,
    mode: String,
    op: String,
    key: String,
    duration: f64,
    proc_id: u64,
    counter_file: String,
    warmup: u64,
}

fn args() -> Args {
    let mut a = Args {
        params: Vec::new(),
        mode: "S1".into(),
        op: "write".into(),
        key: "bench-key".into(),
        duration: 5.0,
        proc_id: 0,
        counter_file: String::new(),
        warmup: 50,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--backend" | "--recipe" | "--variant" => {}
            "--params" => a.params = parse_params(&v),
            "--mode" => a.mode = v,
            "--op" => a.op = v,
            "--key" => a.key = v,
            "--duration" => a.duration = v.parse().expect("--duration"),
            "--proc-id" => a.proc_id = v.parse().expect("--proc-id"),
            "--counter-file" => a.counter_file = v,
            "--warmup" => a.warmup = v.parse().expect("--warmup"),
            other => panic!("unknown flag {other}"),
        }
        i += 2;
    }
    a
}

fn endpoint(a: &Args) -> String {
    let p = |k: &str| {
        a.params
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    format!("{}:{}", p("host"), p("port"))
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

fn wait_for_start() -> u64 {
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

const CLIENT: &str = "distlock (etcd-client 0.21, gRPC)";

fn ready() {
    println!(
        r#"{{"ev":"ready","ready_ns":{},"pid":{},"client":"{CLIENT}"}}"#,
        mono_ns(),
        std::process::id()
    );
    std::io::stdout().flush().unwrap();
}

async fn baseline(a: &Args) {
    let client = etcd_client::Client::connect([format!("http://{}", endpoint(a))], None)
        .await
        .expect("connect");
    let mut kv = client.kv_client();
    let write = a.op != "read";
    let key = "/bench/rtt";
    kv.put(key, "x", None).await.unwrap();
    let mut op = async || {
        if write {
            kv.put(key, "x", None).await.map(|_| ()).unwrap();
        } else {
            kv.get(key, None).await.map(|_| ()).unwrap();
        }
    };
    for _ in 0..a.warmup * 10 {
        op().await;
    }
    ready();
    let start = wait_for_start();
    let end = start + (a.duration * 1e9) as u64;
    let cpu0 = cpu_s();
    let mut lat = Vec::with_capacity(200_000);
    let mut now = start;
    while now < end {
        op().await;
        let t = mono_ns();
        lat.push(t - now);
        now = t;
    }
    let cpu = cpu_s() - cpu0;
    let lat: Vec<String> = lat.iter().map(u64::to_string).collect();
    println!(
        r#"{{"ev":"result","lat_ns":[{}],"ops":{},"start_ns":{start},"finished_ns":{now},"cpu_s":{cpu:.4},"errors":0,"first_error":null,"proc_id":{},"pid":{}}}"#,
        lat.join(","),
        lat.len(),
        a.proc_id,
        std::process::id()
    );
}

async fn cycles(a: &Args) {
    let backend = EtcdBackend::connect(&format!("etcd://{}", endpoint(a)))
        .await
        .expect("connect");
    let reg = LockRegistry::with_options(
        backend,
        RegistryOptions::default().prefix("/bench/distlock"),
    )
    .unwrap();
    let warm = reg
        .obtain(&format!("{}:warmup:{}", a.key, a.proc_id))
        .unwrap();
    for _ in 0..a.warmup {
        warm.lock().await.unwrap().release().await.unwrap();
    }
    let lock = reg.obtain(&a.key).unwrap();
    ready();
    let start = wait_for_start();
    let end = start + (a.duration * 1e9) as u64;
    let cpu0 = cpu_s();
    let s2 = a.mode == "S2";
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
        if s2 {
            write_counter(&a.counter_file, read_counter(&a.counter_file) + 1);
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
    let first_error = match first_error {
        Some(e) => format!("\"{}\"", e.replace('\\', "\\\\").replace('"', "'")),
        None => "null".into(),
    };
    println!(
        r#"{{"ev":"result","cycles":[{}],"start_ns":{start},"end_ns":{end},"finished_ns":{},"cpu_s":{cpu:.4},"errors":{errors},"first_error":{first_error},"proc_id":{},"pid":{},"extra":{{}},"round_trips":2}}"#,
        cycles.join(","),
        mono_ns(),
        a.proc_id,
        std::process::id()
    );
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if a.mode == "baseline" {
            baseline(&a).await
        } else {
            cycles(&a).await
        }
    });
    std::io::stdout().flush().unwrap();
}
