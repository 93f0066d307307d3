//! A Redis Sentinel deployment on loopback: one master, replicas and Sentinels, each a
//! [`RedisServer`] of its own, for failover tests.

use std::io;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use super::{RedisServer, RedisServerOptions};

/// The master name the Sentinels monitor.
pub const MASTER: &str = "mymaster";

/// The Sentinel configuration for a master on `port`: quorum 2, down after 1 s of silence,
/// failovers at most every 3 s; with the data nodes' password (`auth-pass`) and the Sentinels'
/// own (`sentinel-pass`, for their links to each other).
pub(super) fn config(port: u16, data_password: Option<&str>, own: Option<&str>) -> String {
    let mut conf = format!(
        "sentinel monitor {MASTER} 127.0.0.1 {port} 2\n\
         sentinel down-after-milliseconds {MASTER} 1000\n\
         sentinel failover-timeout {MASTER} 3000\n\
         sentinel parallel-syncs {MASTER} 1\n"
    );
    if let Some(p) = data_password {
        conf.push_str(&format!("sentinel auth-pass {MASTER} {p}\n"));
    }
    if let Some(p) = own {
        conf.push_str(&format!("sentinel sentinel-pass {p}\n"));
    }
    conf
}

/// How [`SentinelSet::start_with`] sets the servers up.
#[derive(Debug, Clone, Default)]
pub struct SentinelOptions {
    /// TLS with the certificates in this directory, as [`SentinelSet::start_tls`].
    pub tls: Option<std::path::PathBuf>,
    /// The data nodes' password (`requirepass`, and `masterauth` for replication); the
    /// Sentinels are told it.
    pub password: Option<String>,
    /// The Sentinels' own password (`requirepass` on each Sentinel).
    pub sentinel_password: Option<String>,
    /// Return once the replicas are in sync and every Sentinel names the master, without
    /// waiting the seconds it takes the Sentinels to discover each other and the replicas
    /// (their hello messages go every 2 s): enough for a client, not for a failover.
    pub no_failover: bool,
}

/// One master, `replicas` replicas and three Sentinels. The servers are indexed from 0 (the
/// first master); after a failover another one is master, see [`master`](Self::master).
#[derive(Debug)]
pub struct SentinelSet {
    /// The data nodes: the first master and its replicas.
    pub servers: Vec<RedisServer>,
    /// The Sentinels.
    pub sentinels: Vec<RedisServer>,
    options: SentinelOptions,
}

impl SentinelSet {
    /// Starts the master, its replicas and three Sentinels, and waits until every replica is
    /// in sync and every Sentinel knows the master and all replicas.
    ///
    /// # Errors
    ///
    /// Fails if a server does not start or the set does not settle within 30 s.
    pub fn start(replicas: usize) -> io::Result<SentinelSet> {
        Self::start_with(replicas, SentinelOptions::default())
    }

    /// As [`start`](Self::start), with every server and Sentinel also listening for TLS with
    /// the certificates in `tls` (see [`RedisServerOptions::tls`]), and replication and
    /// Sentinel's links over TLS; [`url`](Self::url) is then a `rediss+sentinel://` URL.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub fn start_tls(replicas: usize, tls: &Path) -> io::Result<SentinelSet> {
        Self::start_with(
            replicas,
            SentinelOptions {
                tls: Some(tls.to_path_buf()),
                ..SentinelOptions::default()
            },
        )
    }

    /// As [`start`](Self::start), set up as `options` say; [`url`](Self::url) carries the
    /// passwords (with `allow_insecure_auth=true` unless over TLS).
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub fn start_with(replicas: usize, options: SentinelOptions) -> io::Result<SentinelSet> {
        let base = RedisServerOptions {
            tls: options.tls.clone(),
            password: options.password.clone(),
            ..Default::default()
        };
        let master = RedisServer::start_with(base.clone())?;
        let port = master.data_port();
        let mut servers = vec![master];
        for _ in 0..replicas {
            servers.push(RedisServer::start_with(RedisServerOptions {
                replica_of: Some(port),
                ..base.clone()
            })?);
        }
        let sentinels = (0..3)
            .map(|_| {
                RedisServer::start_with(RedisServerOptions {
                    sentinel_of: Some(port),
                    password: options.sentinel_password.clone(),
                    master_password: options.password.clone(),
                    ..base.clone()
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        if options.no_failover {
            // A loaded machine can leave the master silent for a second (the default
            // `down-after-milliseconds` here, for quick failover tests); a set that must not
            // fail over waits a minute instead, so that no failover happens under the test.
            for sentinel in &sentinels {
                sentinel.cli(&[
                    "SENTINEL",
                    "SET",
                    MASTER,
                    "down-after-milliseconds",
                    "60000",
                ])?;
            }
        }
        let set = SentinelSet {
            servers,
            sentinels,
            options,
        };
        set.wait_until(Duration::from_secs(30), "the replicas are in sync", |s| {
            s.servers[0]
                .cli(&["INFO", "replication"])
                .map(|info| info.matches("state=online").count() == replicas)
                .unwrap_or(false)
        })?;
        if set.options.no_failover {
            set.wait_until(
                Duration::from_secs(30),
                "the Sentinels name the master",
                |s| {
                    s.sentinels.iter().all(|sen| {
                        sen.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
                            .is_ok_and(|r| r.lines().nth(1) == Some(&port.to_string()))
                    })
                },
            )?;
            return Ok(set);
        }
        set.wait_until(Duration::from_secs(30), "the Sentinels know the set", |s| {
            s.sentinels.iter().all(|sen| {
                sen.cli(&["SENTINEL", "REPLICAS", MASTER])
                    .map(|r| r.matches("flags").count() == replicas)
                    .unwrap_or(false)
                    && sen
                        .cli(&["SENTINEL", "SENTINELS", MASTER])
                        .map(|r| r.matches("flags").count() == 2)
                        .unwrap_or(false)
            })
        })?;
        Ok(set)
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/mymaster`, or with TLS
    /// `rediss+sentinel://` and the Sentinels' TLS ports (add `?ca_file=` for the test CA).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.data_port()))
            .collect();
        let scheme = if self.servers[0].tls_port().is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        let enc = super::percent_encode;
        let userinfo = match &self.options.password {
            Some(p) => format!(":{}@", enc(p)),
            None => String::new(),
        };
        let mut query = Vec::new();
        if let Some(p) = &self.options.sentinel_password {
            query.push(format!("sentinel_password={}", enc(p)));
        }
        let secret = self.options.password.is_some() || self.options.sentinel_password.is_some();
        if secret && self.options.tls.is_none() {
            query.push("allow_insecure_auth=true".to_owned());
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        format!("{scheme}://{userinfo}{}/{MASTER}{query}", hosts.join(","))
    }

    /// The index in [`servers`](Self::servers) of the master the Sentinels name now.
    pub fn master(&self) -> Option<usize> {
        let reply = self
            .sentinels
            .iter()
            .find_map(|s| s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]).ok())?;
        let port: u16 = reply.lines().nth(1)?.trim().parse().ok()?;
        self.servers.iter().position(|s| s.data_port() == port)
    }

    /// Asks the Sentinels for a failover now (`SENTINEL FAILOVER`), and waits until they name
    /// a new master that answers as one. Returns its index.
    ///
    /// # Errors
    ///
    /// Fails if no new master is in place within 30 s.
    pub fn failover(&self) -> io::Result<usize> {
        let old = self.master();
        self.sentinels[0].cli(&["SENTINEL", "FAILOVER", MASTER])?;
        self.await_new_master(old)
    }

    /// Waits until the Sentinels name a master other than `old` that answers as a master.
    ///
    /// # Errors
    ///
    /// Fails if that does not happen within 30 s.
    pub fn await_new_master(&self, old: Option<usize>) -> io::Result<usize> {
        let mut found = None;
        self.wait_until(Duration::from_secs(30), "a new master", |s| {
            found = s.master().filter(|m| Some(*m) != old).filter(|m| {
                s.servers[*m]
                    .cli(&["ROLE"])
                    .map(|r| r.starts_with("master"))
                    .unwrap_or(false)
            });
            found.is_some()
        })?;
        found.ok_or_else(|| io::Error::other("no new master"))
    }

    /// Waits until the current master has `n` replicas in sync (after a failover the others
    /// are reconfigured one by one, each with a full resynchronisation).
    ///
    /// # Errors
    ///
    /// Fails if that does not happen within 30 s.
    pub fn await_replicas(&self, n: usize) -> io::Result<()> {
        self.wait_until(Duration::from_secs(30), "replicas in sync", |s| {
            s.master().is_some_and(|m| {
                s.servers[m]
                    .cli(&["INFO", "replication"])
                    .map(|info| info.matches("state=online").count() >= n)
                    .unwrap_or(false)
            })
        })
    }

    fn wait_until(
        &self,
        limit: Duration,
        what: &str,
        mut cond: impl FnMut(&Self) -> bool,
    ) -> io::Result<()> {
        let start = Instant::now();
        while !cond(self) {
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis sentinel set: {what}: not within {limit:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}
