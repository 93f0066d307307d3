//! The servers of each backend under test, all started by `distlock_testkit`, and the faults
//! each one can suffer as a whole (restart, leader loss).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_testkit::etcd::EtcdCluster;
use distlock_testkit::mysql::{self, MariaDbServer};
use distlock_testkit::postgres::{self, PostgresServer};
use distlock_testkit::redis::cluster::ClusterSet;
use distlock_testkit::redis::sentinel::SentinelSet;
use distlock_testkit::redis::RedisServer;
use distlock_testkit::zookeeper::ZooKeeperEnsemble;

use crate::faults::FaultKind;

/// The backends the harness knows, in the order it runs them.
pub(crate) const ALL: &[&str] = &[
    "sqlite",
    "redis",
    "redis-sentinel",
    "redis-cluster",
    "redlock",
    "postgres",
    "mysql",
    "zookeeper",
    "etcd",
];

/// The Redis key of the workers' lock (prefix `torture`, key `torture-key`).
pub(crate) const LOCK_KEY: &str = "torture:torture-key";

/// How long a member stays down before it is started again.
const DOWN: Duration = Duration::from_millis(500);

/// The running servers of one backend.
pub(crate) enum Servers {
    Sqlite {
        dir: PathGuard,
    },
    Redis(Mutex<RedisServer>),
    /// A master with one replica under three Sentinels.
    RedisSentinel(Mutex<SentinelSet>),
    /// Three masters with a replica each.
    RedisCluster(Mutex<ClusterSet>),
    /// Three independent masters.
    Redlock(Mutex<Vec<RedisServer>>),
    Postgres {
        db: postgres::TestDatabase,
        server: Arc<PostgresServer>,
    },
    Mysql {
        db: mysql::TestDatabase,
        server: Arc<MariaDbServer>,
    },
    ZooKeeper(ZooKeeperEnsemble),
    Etcd(EtcdCluster),
}

/// A directory removed on drop.
pub(crate) struct PathGuard(std::path::PathBuf);

impl Drop for PathGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Servers {
    /// Starts the servers of `backend` (blocking; seconds for the ensembles and SQL servers).
    /// The SQL servers are throwaway ones of this process, never the machine's, because the
    /// nemesis kills them.
    pub(crate) fn start(backend: &str) -> io::Result<Servers> {
        Ok(match backend {
            "sqlite" => {
                let dir = std::env::temp_dir().join(format!(
                    "distlock-torture-{}-{:08x}",
                    std::process::id(),
                    rand::random::<u32>()
                ));
                std::fs::create_dir_all(&dir)?;
                Servers::Sqlite {
                    dir: PathGuard(dir),
                }
            }
            "redis" => Servers::Redis(Mutex::new(RedisServer::start()?)),
            "redis-sentinel" => Servers::RedisSentinel(Mutex::new(SentinelSet::start(1)?)),
            "redis-cluster" => Servers::RedisCluster(Mutex::new(ClusterSet::start()?)),
            "redlock" => Servers::Redlock(Mutex::new(RedisServer::start_independent(3)?)),
            "postgres" => {
                let server = Arc::new(PostgresServer::start()?);
                let db = server.fresh_database()?;
                Servers::Postgres { db, server }
            }
            "mysql" => {
                let server = Arc::new(MariaDbServer::start()?);
                let db = server.fresh_database()?;
                Servers::Mysql { db, server }
            }
            "zookeeper" => Servers::ZooKeeper(ZooKeeperEnsemble::start(3)?),
            "etcd" => Servers::Etcd(EtcdCluster::start(3)?),
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unknown backend {other:?} (known: {})", ALL.join(", ")),
                ))
            }
        })
    }

    /// The addresses a worker connects to: one fault proxy is put in front of each.
    pub(crate) fn targets(&self) -> Vec<SocketAddr> {
        match self {
            Servers::Sqlite { .. } => Vec::new(),
            Servers::Redis(r) => vec![r.lock().unwrap_or_else(|e| e.into_inner()).addr()],
            // Workers reach the nodes the Sentinels name, not proxies: no connection faults.
            Servers::RedisSentinel(_) => Vec::new(),
            // Workers reach the nodes of the slot map, not proxies: no connection faults.
            Servers::RedisCluster(_) => Vec::new(),
            Servers::Redlock(nodes) => nodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(RedisServer::addr)
                .collect(),
            Servers::Postgres { db, .. } => vec![url_addr(db.url())],
            Servers::Mysql { db, .. } => vec![url_addr(db.url())],
            Servers::ZooKeeper(zk) => (0..zk.len()).map(|i| zk.addr(i)).collect(),
            Servers::Etcd(etcd) => etcd
                .endpoints()
                .iter()
                .map(|e| url_addr(&e.replace("http://", "tcp://")))
                .collect(),
        }
    }

    /// The backend URL of a worker whose proxies listen on `proxies` (one per target).
    pub(crate) fn worker_url(&self, proxies: &[SocketAddr], lease: Duration) -> String {
        let hosts = || {
            proxies
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Servers::Sqlite { dir } => format!("sqlite://{}/locks.db", dir.0.display()),
            Servers::Redis(_) => format!("redis://{}", proxies[0]),
            Servers::RedisSentinel(set) => set.lock().unwrap_or_else(|e| e.into_inner()).url(),
            Servers::RedisCluster(set) => set.lock().unwrap_or_else(|e| e.into_inner()).url(),
            Servers::Redlock(_) => format!("redlock://{}", hosts()),
            Servers::Postgres { db, .. } => with_addr(db.url(), proxies[0]),
            Servers::Mysql { db, .. } => with_addr(db.url(), proxies[0]),
            // The session is sized to the lease, as the backend's docs ask ("keep the lease at
            // most the session timeout"), so that a killed holder frees the lock after a lease.
            Servers::ZooKeeper(_) => format!(
                "zk://{}/torture?session_timeout={}ms",
                hosts(),
                lease.as_millis()
            ),
            Servers::Etcd(_) => format!("etcd://{}", hosts()),
        }
    }

    /// The faults this backend can suffer.
    pub(crate) fn faults(&self) -> Vec<FaultKind> {
        let mut kinds = vec![
            FaultKind::Pause,
            FaultKind::Kill,
            FaultKind::WaiterKill,
            FaultKind::Abandon,
        ];
        match self {
            Servers::Sqlite { .. } => {}
            Servers::Redis(_)
            | Servers::Redlock(_)
            | Servers::Postgres { .. }
            | Servers::Mysql { .. } => {
                kinds.extend([FaultKind::Stall, FaultKind::Cut, FaultKind::ServerRestart])
            }
            Servers::RedisSentinel(_) | Servers::RedisCluster(_) => {
                kinds.push(FaultKind::LeaderKill)
            }
            Servers::ZooKeeper(_) | Servers::Etcd(_) => {
                kinds.extend([FaultKind::Stall, FaultKind::Cut, FaultKind::LeaderKill])
            }
        }
        kinds
    }

    /// Whether a foreign client (plain `SET NX PX`) contends for the workers' lock: on Redis,
    /// Sentinel and Cluster (Redlock's majority is no single key to set).
    pub(crate) fn has_foreign(&self) -> bool {
        matches!(
            self,
            Servers::Redis(_) | Servers::RedisSentinel(_) | Servers::RedisCluster(_)
        )
    }

    /// Where the foreign client sends its commands now: the server, the master the Sentinels
    /// name, or the master of the lock's slot (blocking). Straight to it, never through a
    /// fault proxy.
    pub(crate) fn foreign_target(&self) -> io::Result<SocketAddr> {
        match self {
            Servers::Redis(r) => Ok(r.lock().unwrap_or_else(|e| e.into_inner()).addr()),
            Servers::RedisSentinel(set) => {
                let set = set.lock().unwrap_or_else(|e| e.into_inner());
                let master = sentinel_master(&set)?;
                Ok(set.servers[master].addr())
            }
            Servers::RedisCluster(set) => {
                let mut set = set.lock().unwrap_or_else(|e| e.into_inner());
                let master = lock_slot_master(&mut set)?;
                Ok(set.nodes[master].addr())
            }
            _ => Err(io::Error::other("no foreign client on this backend")),
        }
    }

    /// With Sentinel: which data node the Sentinels name master now (`None` for the other
    /// backends, or when none is named).
    pub(crate) fn sentinel_master(&self) -> Option<usize> {
        match self {
            Servers::RedisSentinel(set) => set.lock().unwrap_or_else(|e| e.into_inner()).master(),
            _ => None,
        }
    }

    /// Whether this is Redis under Sentinel.
    pub(crate) fn has_sentinels(&self) -> bool {
        matches!(self, Servers::RedisSentinel(_))
    }

    /// Whether the backend issues fences (Redlock does not).
    pub(crate) fn fences(&self) -> bool {
        !matches!(self, Servers::Redlock(_))
    }

    /// Kills the server (`SIGKILL`) and starts it again after a moment. Returns whether the
    /// restart lost the data (Redis runs without persistence; the SQL servers keep theirs).
    pub(crate) fn restart_server(&self) -> io::Result<bool> {
        match self {
            Servers::Redis(r) => {
                let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
                r.kill();
                std::thread::sleep(DOWN);
                r.restart()?;
                Ok(true)
            }
            // One node at a time, empty when it comes back: a majority always keeps the key.
            Servers::Redlock(nodes) => {
                let mut nodes = nodes.lock().unwrap_or_else(|e| e.into_inner());
                let i = rand::random::<u32>() as usize % nodes.len();
                nodes[i].kill();
                std::thread::sleep(DOWN);
                nodes[i].restart()?;
                Ok(true)
            }
            Servers::Postgres { server, .. } => {
                server.stop();
                std::thread::sleep(DOWN);
                server.start_again()?;
                Ok(false)
            }
            Servers::Mysql { server, .. } => {
                server.stop();
                std::thread::sleep(DOWN);
                server.start_again()?;
                Ok(false)
            }
            _ => Err(io::Error::other(
                "this backend has no single server to restart",
            )),
        }
    }

    /// Kills the leader of the ensemble and starts it again after a moment; returns its index.
    pub(crate) fn kill_leader(&self) -> io::Result<usize> {
        match self {
            Servers::ZooKeeper(zk) => {
                let leader = zk.leader()?;
                zk.kill(leader);
                std::thread::sleep(DOWN);
                zk.restart(leader)?;
                Ok(leader)
            }
            Servers::Etcd(etcd) => {
                let leader = etcd.leader()?;
                etcd.kill(leader);
                std::thread::sleep(DOWN);
                etcd.restart(leader)?;
                Ok(leader)
            }
            // The master is killed and comes back (empty) only after the Sentinels promoted
            // its replica: an unpersisted master that returned before would wipe the replica.
            Servers::RedisSentinel(set) => {
                let mut set = set.lock().unwrap_or_else(|e| e.into_inner());
                let master = sentinel_master(&set)?;
                set.servers[master].kill();
                let new_master = set.await_new_master(Some(master))?;
                set.servers[master].restart()?;
                // Back as a replica of the new master at once, as a restart script that asks
                // the Sentinels first does. Left alone, it stays a master until a Sentinel's
                // next INFO (every 10 s) converts it, and the new master meets no
                // `min_replicas` all that time: an outage of the Sentinels' making, not
                // distlock's (docs/BACKENDS.md says what it costs a deployment).
                let port = set.servers[new_master].data_port().to_string();
                set.servers[master].cli(&["REPLICAOF", "127.0.0.1", &port])?;
                Ok(master)
            }
            // The master of the lock's slot: killed (kill -9) and back, empty, as a replica of
            // its promoted replica once that is in place; every second time instead a manual
            // failover (`CLUSTER FAILOVER`), which loses nothing.
            Servers::RedisCluster(set) => {
                let mut set = set.lock().unwrap_or_else(|e| e.into_inner());
                let master = lock_slot_master(&mut set)?;
                static ROUNDS: AtomicUsize = AtomicUsize::new(0);
                if ROUNDS.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
                    let promoted = set.kill_master(master)?;
                    set.rejoin(master, promoted)?;
                } else {
                    set.failover(master)?;
                }
                Ok(master)
            }
            _ => Err(io::Error::other("this backend has no leader")),
        }
    }
}

/// `host:port` of a URL.
fn url_addr(url: &str) -> SocketAddr {
    let parsed = url::Url::parse(url).expect("the testkit gives valid URLs");
    let host = parsed.host_str().unwrap_or("127.0.0.1");
    let port = parsed.port().unwrap_or(0);
    format!("{host}:{port}")
        .parse()
        .expect("the testkit's servers listen on loopback addresses")
}

/// `url` with its host and port replaced by `addr`.
fn with_addr(url: &str, addr: SocketAddr) -> String {
    let mut parsed = url::Url::parse(url).expect("the testkit gives valid URLs");
    let _ = parsed.set_ip_host(addr.ip());
    let _ = parsed.set_port(Some(addr.port()));
    parsed.to_string()
}

/// The master the Sentinels name now.
fn sentinel_master(set: &SentinelSet) -> io::Result<usize> {
    set.master()
        .ok_or_else(|| io::Error::other("the Sentinels name no master"))
}

/// The node serving the lock's slot as its master now.
fn lock_slot_master(set: &mut ClusterSet) -> io::Result<usize> {
    let slot = set.slot_of(LOCK_KEY)?;
    set.master_of(slot)
        .ok_or_else(|| io::Error::other("no master serves the lock's slot"))
}
