//! One measuring process for `bench/zookeeper` (run through `bench/zookeeper/run.sh`): the
//! worker protocol of `worker.py` of the other-backends harness, with distlock's ZooKeeper
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
//! `/bench/locks/<key>/_c_<uuid>-lock-<seq>`). `--params` is `{"hosts": "127.0.0.1:PORT"}`.
//!
//! `cargo build --release -p distlock-bench --features zookeeper --bin zk_bench_worker`.

use std::time::Duration;

use distlock::backends::zookeeper::ZooKeeperBackend;
use distlock::{LockRegistry, RegistryOptions};
use distlock_bench::{block_on, measure_cycles, measure_ops, WorkerArgs};

const CLIENT: &str = "distlock 0.1.0 (zookeeper-client 0.11)";

async fn run(a: WorkerArgs) {
    let url = format!("zk://{}/bench/locks", a.param("hosts"));
    let backend = ZooKeeperBackend::connect(&url).await.expect("connect");
    if a.mode == "baseline" {
        let client = backend.client().await.expect("client");
        let write = a.op == "write";
        let op = async || {
            if write {
                client.set_data("/bench/rtt", b"x", None).await.map(|_| ())
            } else {
                client.get_data("/bench/rtt").await.map(|_| ())
            }
            .expect("op")
        };
        measure_ops(op, CLIENT, a.duration, a.proc_id, a.warmup * 10).await;
        return;
    }
    // A ZooKeeper lease is a session, and the harness's server (tickTime 1000) grants at most
    // 20 s, below the default 30 s lease: use kazoo's session timeout in the same run, 10 s.
    let options = RegistryOptions::default().with_lease(Duration::from_secs(10));
    let registry = LockRegistry::with_options(backend, options).expect("registry");
    measure_cycles(&registry, &a, CLIENT, 2).await;
}

fn main() {
    block_on(run(WorkerArgs::from_env()));
}
