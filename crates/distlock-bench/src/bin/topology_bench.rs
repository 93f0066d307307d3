//! distlock on the Redis topologies beside the raw cycle each is measured against, in the same
//! run, alternating rounds. One client, one key, acquire + release back to back (the shape of
//! the Redis lock harness's S1).
//!
//! - `redlock`: three independent `redis-server`s; raw = parallel `SET key token NX PX` to every
//!   node, then a parallel compare-and-delete (redsync's cycle).
//! - `sentinel`: a master with one replica under three Sentinels, `min_replicas=1`; raw = `SET`
//!   plus `WAIT 1 0` issued by redis-rs on the master; distlock with `min_replicas=0` between
//!   them, for what the `WAIT` costs.
//! - `cluster`: three masters with a replica each; distlock there with its default
//!   `min_replicas=1` and with `min_replicas=0`, beside distlock on one plain `redis-server`
//!   (the reference, first) and on a `redis-server` with a replica (no `WAIT`: what
//!   replication alone costs on this machine).
//!
//! `cargo run --release -p distlock-bench --features topologies --bin topology_bench -- redlock|sentinel|cluster [SECONDS]`
//!
//! Prints one JSON line per measurement and the ratio of the last peer to the first.

use std::time::{Duration, Instant};

use distlock::backends::redis::redlock::RedlockBackend;
use distlock::backends::redis::RedisBackend;
use distlock::{LockRegistry, RegistryOptions};
use distlock_testkit::redis::cluster::ClusterSet;
use distlock_testkit::redis::sentinel::SentinelSet;
use distlock_testkit::redis::{RedisServer, RedisServerOptions};
use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;

/// Counted rounds per peer, after one warm-up round.
const ROUNDS: u32 = 4;

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

/// `SET k v` then `WAIT 1 0` on the master, as redis-rs issues them.
async fn set_wait_cycles(conn: &mut MultiplexedConnection, until: Instant) -> u64 {
    let mut cycles = 0;
    while Instant::now() < until {
        let _: () = redis::cmd("SET")
            .arg("raw:k")
            .arg(cycles)
            .query_async(conn)
            .await
            .expect("SET");
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(0)
            .query_async(conn)
            .await
            .expect("WAIT");
        assert!(acked >= 1, "WAIT 1: no replica");
        cycles += 1;
    }
    cycles
}

async fn connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let topology = args.next().unwrap_or_else(|| "redlock".into());
    let secs: f64 = args
        .next()
        .map(|s| s.parse().expect("SECONDS must be a number"))
        .unwrap_or(5.0);
    let span = Duration::from_secs_f64(secs);
    let (mut peers, _servers): (Vec<(&str, Peer)>, Box<dyn std::any::Any>) = match topology.as_str()
    {
        "redlock" => {
            let nodes = RedisServer::start_independent(3).expect("redis-server");
            let url = RedisServer::redlock_url(&nodes);
            let backend = RedlockBackend::connect(&url).await.expect("connect");
            let mut conns = Vec::new();
            for n in &nodes {
                conns.push(connection(&n.url()).await);
            }
            let peers = vec![
                ("raw", Peer::Redlock(conns)),
                ("distlock", Peer::Registry(registry(backend))),
            ];
            (peers, Box::new(nodes))
        }
        "sentinel" => {
            let set = SentinelSet::start(1).expect("redis-server");
            let url = format!("{}?min_replicas=1", set.url());
            let backend = RedisBackend::connect(&url).await.expect("connect");
            let unreplicated = format!("{}?min_replicas=0", set.url());
            let no_wait = RedisBackend::connect(&unreplicated).await.expect("connect");
            let master = set.master().expect("a master");
            let conn = connection(&set.servers[master].url()).await;
            let peers = vec![
                ("raw", Peer::SetWait(conn)),
                // What the cycle costs without `WAIT`: the rest is the replica's acknowledgement.
                ("distlock-min_replicas=0", Peer::Registry(registry(no_wait))),
                ("distlock", Peer::Registry(registry(backend))),
            ];
            (peers, Box::new(set))
        }
        "cluster" => {
            let single = RedisServer::start().expect("redis-server");
            let replicated = RedisServer::start().expect("redis-server");
            let replica = RedisServer::start_with(RedisServerOptions {
                replica_of: Some(replicated.port()),
                ..Default::default()
            })
            .expect("redis-server");
            let set = ClusterSet::start().expect("redis-server");
            let one = RedisBackend::connect(&single.url()).await.expect("connect");
            let with_replica = RedisBackend::connect(&replicated.url())
                .await
                .expect("connect");
            let unreplicated = format!("{}?min_replicas=0", set.url());
            let zero = RedisBackend::connect(&unreplicated).await.expect("connect");
            let cluster = RedisBackend::connect(&set.url()).await.expect("connect");
            let peers = vec![
                ("single-node", Peer::Registry(registry(one))),
                (
                    "single-node with a replica",
                    Peer::Registry(registry(with_replica)),
                ),
                ("cluster min_replicas=0", Peer::Registry(registry(zero))),
                ("cluster", Peer::Registry(registry(cluster))),
            ];
            (peers, Box::new((single, replicated, replica, set)))
        }
        other => panic!("unknown topology {other:?}: redlock, sentinel or cluster"),
    };
    let mut rates = vec![0.0f64; peers.len()];
    let share = span / ((ROUNDS + 1) * peers.len() as u32);
    // Rounds alternate between the peers, so that drift in the machine's load hits all alike.
    // Round 0 is a warm-up and not counted: the first seconds after the servers start run
    // much faster (a raw peer measured twice in a row, as raw and raw2, gave 11.4k then 6.6k
    // cycles/s, and about 6k in every later round), which would favour whoever runs first.
    for round in 0..=ROUNDS {
        for (i, (name, peer)) in peers.iter_mut().enumerate() {
            let start = Instant::now();
            let until = start + share;
            let cycles = match peer {
                Peer::Redlock(conns) => raw_cycles(conns, until).await,
                Peer::SetWait(conn) => set_wait_cycles(conn, until).await,
                Peer::Registry(reg) => distlock_cycles(reg, until).await,
            };
            let rate = cycles as f64 / start.elapsed().as_secs_f64();
            if round > 0 {
                rates[i] += rate / f64::from(ROUNDS);
            }
            println!(
                "{}",
                serde_json::json!({"topology": topology, "round": round, "warm_up": round == 0, "peer": name, "cycles": cycles, "cycles_per_s": rate.round()})
            );
        }
    }
    let summary: serde_json::Map<String, serde_json::Value> = peers
        .iter()
        .zip(&rates)
        .map(|((name, _), r)| (format!("{name} cycles_per_s"), r.round().into()))
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "topology": topology,
            "rates": summary,
            "ratio": (rates[rates.len() - 1] / rates[0] * 100.0).round() / 100.0,
        })
    );
}

/// One side of the comparison.
enum Peer {
    Redlock(Vec<MultiplexedConnection>),
    SetWait(MultiplexedConnection),
    Registry(LockRegistry),
}

fn registry(backend: impl distlock::Backend + 'static) -> LockRegistry {
    LockRegistry::from_backend(std::sync::Arc::new(backend), RegistryOptions::default())
        .expect("registry")
}
