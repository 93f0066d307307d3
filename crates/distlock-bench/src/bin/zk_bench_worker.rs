//! One measuring process for `bench/zookeeper` (run through `bench/zookeeper/run.sh`): the
//! worker protocol of `../shared/bench/other-backends/worker.py`, with distlock's ZooKeeper
//! backend in place of kazoo.
//!
//! 1. connect, warm up (private key, not measured), print `{"ev":"ready",...}`;
//! 2. read one line `start <CLOCK_MONOTONIC ns>` from stdin, wait until then;
//! 3. loop for `--duration` seconds, keeping timestamps in memory;
//! 4. print `{"ev":"result",...}` and exit 0.
//!
//! Modes: `baseline` (`--op read|write`: `get_data` / `set_data` of `/bench/rtt` through the
//! same client library), `S1` (lock + release back to back), `S2` (lock, read a counter file,
//! write value + 1, release). Locks live under `/bench/locks` (Curator layout:
//! `/bench/locks/<key>/_c_<uuid>-lock-<seq>`). Timestamps are CLOCK_MONOTONIC nanoseconds, the
//! clock of Python's `time.monotonic_ns()`, comparable across processes.

#[path = "support/worker.rs"]
mod worker;
use worker::{measure_cycles, OpTimer};

use distlock::backends::zookeeper::ZooKeeperBackend;
use distlock::{LockRegistry, RegistryOptions};

struct Args {
    hosts: String,
    mode: String,
    op: String,
    key: String,
    duration: f64,
    proc_id: u32,
    counter_file: String,
    warmup: u32,
}

fn parse_args() -> Args {
    let mut a = Args {
        hosts: String::new(),
        mode: String::new(),
        op: "write".into(),
        key: "bench-key".into(),
        duration: 5.0,
        proc_id: 0,
        counter_file: String::new(),
        warmup: 50,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        match argv[i].as_str() {
            // {"hosts": "127.0.0.1:PORT"}
            "--params" => {
                a.hosts = v
                    .split("\"hosts\"")
                    .nth(1)
                    .and_then(|r| r.split('"').nth(1))
                    .expect("--params has hosts")
                    .to_owned()
            }
            "--mode" => a.mode = v,
            "--op" => a.op = v,
            "--key" => a.key = v,
            "--duration" => a.duration = v.parse().expect("--duration"),
            "--proc-id" => a.proc_id = v.parse().expect("--proc-id"),
            "--counter-file" => a.counter_file = v,
            "--warmup" => a.warmup = v.parse().expect("--warmup"),
            _ => {} // --backend, --recipe, --variant
        }
        i += 2;
    }
    a
}

async fn run(a: Args) {
    let url = format!("zk://{}/bench/locks", a.hosts);
    let backend = ZooKeeperBackend::connect(&url).await.expect("connect");
    let client = backend.client().await.expect("client");
    let client_name = "distlock 0.1.0 (zookeeper-client 0.11)";
    if a.mode == "baseline" {
        let write = a.op == "write";
        let op = || async {
            if write {
                client.set_data("/bench/rtt", b"x", None).await.map(|_| ())
            } else {
                client.get_data("/bench/rtt").await.map(|_| ())
            }
        };
        for _ in 0..a.warmup * 10 {
            op().await.expect("warm-up op");
        }
        let mut timer = OpTimer::start(client_name, a.duration);
        while timer.running() {
            op().await.expect("op");
            timer.tick();
        }
        timer.finish(u64::from(a.proc_id));
        return;
    }

    let registry =
        LockRegistry::with_options(backend, RegistryOptions::default()).expect("registry");
    let lock = registry.obtain(&a.key).expect("key");
    let warm = registry
        .obtain(&format!("{}:warmup:{}", a.key, a.proc_id))
        .expect("key");
    for _ in 0..a.warmup {
        warm.lock()
            .await
            .expect("warm-up lock")
            .release()
            .await
            .expect("warm-up release");
    }
    let counter = (a.mode == "S2").then_some(a.counter_file.as_str());
    measure_cycles(
        &lock,
        client_name,
        a.duration,
        u64::from(a.proc_id),
        counter,
        2,
    )
    .await;
}

fn main() {
    let args = parse_args();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(args));
}
