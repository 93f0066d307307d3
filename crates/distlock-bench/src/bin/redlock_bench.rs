//! Redlock on three independent `redis-server`s, measured beside the raw redsync-style cycle
//! in the same run: parallel `SET key token NX PX` to every node, then a parallel
//! compare-and-delete. One client, one key, acquire + release back to back (the shape of the
//! shared harness's S1).
//!
//! `cargo run --release -p distlock-bench --features redlock --bin redlock_bench -- [SECONDS]`
//!
//! Prints one JSON line per measurement and the ratio distlock / raw.

use std::time::{Duration, Instant};

use distlock::backends::redis::redlock::RedlockBackend;
use distlock::testkit::redis::RedisServer;
use distlock::{LockRegistry, RegistryOptions};
use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;

const UNLOCK: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

async fn raw_cycles(conns: &mut [MultiplexedConnection], until: Instant) -> u64 {
    let script = redis::Script::new(UNLOCK);
    let mut cycles = 0;
    while Instant::now() < until {
        let token = format!("{:032x}", rand_token());
        let sets = join_all(conns.iter_mut().map(|c| {
            let mut c = c.clone();
            let token = token.clone();
            async move {
                redis::cmd("SET")
                    .arg("lock:raw")
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async::<Option<String>>(&mut c)
                    .await
            }
        }))
        .await;
        let won = sets.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        assert!(won >= 2, "raw: no majority on an uncontended key");
        join_all(conns.iter_mut().map(|c| {
            let mut c = c.clone();
            let token = token.clone();
            let script = script.clone();
            async move {
                script
                    .key("lock:raw")
                    .arg(&token)
                    .invoke_async::<i64>(&mut c)
                    .await
            }
        }))
        .await;
        cycles += 1;
    }
    cycles
}

fn rand_token() -> u128 {
    // Distinct per cycle is all the raw reference needs.
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    u128::from(N.fetch_add(1, Ordering::Relaxed)) << 64 | u128::from(std::process::id())
}

async fn distlock_cycles(reg: &LockRegistry, until: Instant) -> u64 {
    let lock = reg.obtain("bench").expect("key");
    let mut cycles = 0;
    while Instant::now() < until {
        let g = lock.lock().await.expect("lock");
        g.release().await.expect("release");
        cycles += 1;
    }
    cycles
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("SECONDS must be a number"))
        .unwrap_or(5.0);
    let nodes = RedisServer::start_independent(3).expect("redis-server must be installed");
    let url = RedisServer::redlock_url(&nodes);
    let backend = RedlockBackend::connect(&url).await.expect("connect");
    let reg = LockRegistry::from_backend(std::sync::Arc::new(backend), RegistryOptions::default())
        .expect("registry");
    let mut conns = Vec::new();
    for n in &nodes {
        let client = redis::Client::open(n.url()).expect("client");
        conns.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
        );
    }
    let span = Duration::from_secs_f64(secs);
    let mut rates = [0.0f64; 2];
    // Two rounds each, alternating, so that drift in the machine's load hits both alike.
    for round in 0..2 {
        for (i, name) in ["raw", "distlock"].iter().enumerate() {
            let start = Instant::now();
            let cycles = if i == 0 {
                raw_cycles(&mut conns, start + span / 2).await
            } else {
                distlock_cycles(&reg, start + span / 2).await
            };
            let rate = cycles as f64 / start.elapsed().as_secs_f64();
            rates[i] += rate / 2.0;
            println!(
                "{}",
                serde_json::json!({"round": round, "peer": name, "cycles": cycles, "cycles_per_s": rate.round()})
            );
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "raw_cycles_per_s": rates[0].round(),
            "distlock_cycles_per_s": rates[1].round(),
            "ratio": (rates[1] / rates[0] * 100.0).round() / 100.0,
        })
    );
}
