//! One measuring process for the etcd lock benchmark (`bench/etcd/run.sh`), speaking the worker
//! protocol of `../shared/bench/other-backends/worker.py`, so that the shared harness's analysis
//! applies unchanged:
//!
//! 1. connect, warm up on a private key, print `{"ev":"ready",...}`;
//! 2. read `start <CLOCK_MONOTONIC ns>` from stdin and wait until then;
//! 3. loop for `--duration` seconds, timestamps in memory only;
//! 4. print `{"ev":"result",...}` and exit 0.
//!
//! Modes: `baseline` (`--op read|write`: a range or a put of one key through the gRPC client of
//! distlock's etcd backend, `EtcdBackend::raw_get` / `raw_put`), `S1` (acquire + release), `S2` (acquire, read and write the
//! counter file, release). `--recipe distlock` (a `LockRegistry` over `EtcdBackend`);
//! `--params` is the harness's JSON connection parameters (`{"host": .., "port": ..}`).
//!
//! `cargo build --release -p distlock --features etcd --example etcd_bench_worker`.

use std::io::Write;

#[path = "support/worker.rs"]
mod worker;
use worker::{measure_cycles, parse_params, OpTimer};

use distlock::backends::etcd::EtcdBackend;
use distlock::{LockRegistry, RegistryOptions};

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

const CLIENT: &str = "distlock (tonic gRPC)";

async fn baseline(a: &Args) {
    let client = EtcdBackend::connect(&format!("etcd://{}", endpoint(a)))
        .await
        .expect("connect");
    let write = a.op != "read";
    let key = "/bench/rtt";
    client.raw_put(key, "x").await.unwrap();
    let op = async || {
        if write {
            client.raw_put(key, "x").await.unwrap();
        } else {
            client.raw_get(key).await.map(|_| ()).unwrap();
        }
    };
    for _ in 0..a.warmup * 10 {
        op().await;
    }
    let mut timer = OpTimer::start(CLIENT, a.duration);
    while timer.running() {
        op().await;
        timer.tick();
    }
    timer.finish(a.proc_id);
}

async fn cycles(a: &Args) {
    let backend = EtcdBackend::connect(&format!("etcd://{}", endpoint(a)))
        .await
        .expect("connect");
    let reg = LockRegistry::with_options(
        backend,
        RegistryOptions::default().with_prefix("/bench/distlock"),
    )
    .unwrap();
    let warm = reg
        .obtain(&format!("{}:warmup:{}", a.key, a.proc_id))
        .unwrap();
    for _ in 0..a.warmup {
        warm.lock().await.unwrap().release().await.unwrap();
    }
    let lock = reg.obtain(&a.key).unwrap();
    let counter = (a.mode == "S2").then_some(a.counter_file.as_str());
    measure_cycles(&lock, CLIENT, a.duration, a.proc_id, counter, 2).await;
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
