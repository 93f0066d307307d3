//! One measuring process for the etcd lock benchmark (`bench/etcd/run.sh`), speaking the worker
//! protocol of `worker.py` of the other-backends harness, so that its analysis
//! applies unchanged:
//!
//! 1. connect, warm up on a private key, print `{"ev":"ready",...}`;
//! 2. read `start <CLOCK_MONOTONIC ns>` from stdin and wait until then;
//! 3. loop for `--duration` seconds, timestamps in memory only;
//! 4. print `{"ev":"result",...}` and exit 0.
//!
//! Modes: `baseline` (`--op read|write`: a range or a put of one key through the gRPC client of
//! distlock's etcd backend, `EtcdBackend::raw_get` / `raw_put`), `S1` (acquire + release), `S2`
//! (acquire, read and write the counter file, release). `--recipe distlock` (a `LockRegistry`
//! over `EtcdBackend`); `--params` is the harness's JSON connection parameters
//! (`{"host": .., "port": ..}`).
//!
//! `cargo build --release -p distlock-bench --features etcd --bin etcd_bench_worker`.

use distlock::backends::etcd::EtcdBackend;
use distlock::{LockRegistry, RegistryOptions};
use distlock_bench::{measure_cycles, measure_ops, run_worker, WorkerArgs};

const CLIENT: &str = "distlock (tonic gRPC)";

fn url(a: &WorkerArgs) -> String {
    format!("etcd://{}:{}", a.param("host"), a.param("port"))
}

async fn baseline(a: &WorkerArgs) {
    let client = EtcdBackend::connect(&url(a)).await.expect("connect");
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
    measure_ops(op, CLIENT, a.duration, a.proc_id, a.warmup * 10).await;
}

async fn cycles(a: &WorkerArgs) {
    let backend = EtcdBackend::connect(&url(a)).await.expect("connect");
    let reg = LockRegistry::with_options(
        backend,
        RegistryOptions::default().with_prefix("/bench/distlock"),
    )
    .unwrap();
    measure_cycles(&reg, a, CLIENT, 2).await;
}

fn main() {
    run_worker(
        |a| async move { baseline(&a).await },
        |a| async move { cycles(&a).await },
    );
}
