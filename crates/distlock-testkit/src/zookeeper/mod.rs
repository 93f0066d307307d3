//! Throwaway ZooKeeper servers on free loopback ports: one standalone server, or an ensemble of
//! several, each with its own data directory, started from Debian's `zookeeper` package.
//!
//! The package has no service wrapper to use here (no systemd), so the testkit runs the server
//! class itself: `java -cp /usr/share/java/zookeeper.jar
//! org.apache.zookeeper.server.quorum.QuorumPeerMain <own zoo.cfg>`. The jar's manifest names
//! its dependencies (netty, jute, slf4j, ...), so the one jar is the whole classpath;
//! `slf4j-simple.jar` is added when present so that the server's warnings land in its log.
//!
//! The configuration is made for tests: `tickTime=100` (so sessions, and so leases, may be as
//! short as 200 ms; the maximum is [`MAX_SESSION`], an hour), `forceSync=no`, the admin server
//! off, every four-letter command allowed, and empty container nodes reaped every 200 ms
//! (`-Dznode.container.checkIntervalMs=200`, the server's default is a minute).
//!
//! Servers are killed with the test process, however it ends (the kernel sends them `SIGKILL`
//! when it exits). A missing `java` or jar is an error that says to `apt-get install zookeeper`;
//! tests never skip.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

mod members;

use self::members::{java, plan, Members};
use super::proxy::FaultProxy;
use super::{free_port, remove_leftover_dirs, TempDir};

/// The server jar of Debian's `libzookeeper-java` (a dependency of `zookeeper`).
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
const DIR_PREFIX: &str = "distlock-testkit-zk";
const PORT_ATTEMPTS: usize = 5;
/// The servers' `tickTime`: sessions end at most one tick after their timeout, and a server
/// cut off from its leader keeps serving reads for up to [`SYNC_LIMIT`] ticks.
pub const TICK_TIME: Duration = Duration::from_millis(100);
/// The servers' `syncLimit`, in ticks.
pub const SYNC_LIMIT: u32 = 20;
/// The servers' `maxSessionTimeout`: the longest lease they grant (a ZooKeeper lease is a
/// session). Longer than ZooKeeper's default (20 ticks) so that tests may size leases by how
/// slow the machine is.
pub const MAX_SESSION: Duration = Duration::from_secs(3600);

/// TLS for a server's clients ([`ZooKeeperServer::start_tls`]): ZooKeeper's Netty connection
/// factory serves a `secureClientPort` beside the plain client port (which the testkit keeps for
/// its four-letter commands), with PEM files (`ssl.keyStore.type=PEM`).
#[derive(Clone, Debug)]
pub struct ZooKeeperTls {
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// The server's private key (PEM, unencrypted PKCS#8).
    pub key: PathBuf,
    /// The CA (PEM) that client certificates must be signed by.
    pub ca: PathBuf,
    /// `ssl.clientAuth=need` when true (a client without a certificate of `ca` is refused),
    /// `none` when false.
    pub need_client_auth: bool,
}

impl ZooKeeperTls {
    /// The server certificate and CA of a [`TestCa`](super::tls::TestCa).
    pub fn from_test_ca(ca: &super::tls::TestCa, need_client_auth: bool) -> ZooKeeperTls {
        let (cert, key) = ca.server_cert_and_key();
        ZooKeeperTls {
            cert,
            key,
            ca: ca.ca_cert(),
            need_client_auth,
        }
    }
}

/// Sends a four-letter command (`ruok`, `srvr`, `mntr`, `cons`, ...) and returns the answer.
///
/// # Errors
/// When the server does not accept the connection or does not answer within two seconds.
pub fn four_letter(addr: SocketAddr, cmd: &str) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(cmd.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// A standalone ZooKeeper server on `127.0.0.1` at a free port, with its own data directory.
///
/// All methods take `&self`, so one server can be shared (see [`shared`](Self::shared)). The
/// data survives [`kill`](Self::kill) and [`restart`](Self::restart) (sessions included: a
/// client that reconnects in time keeps its session). Dropping it kills the process and removes
/// the directory.
///
/// ```no_run
/// use distlock_testkit::zookeeper::ZooKeeperServer;
/// let server = ZooKeeperServer::start()?;
/// assert_eq!(server.four_letter("ruok")?, "imok");
/// server.restart()?; // same port, same data
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct ZooKeeperServer {
    inner: Mutex<Members>,
    port: u16,
    _dir: TempDir,
}

impl fmt::Debug for ZooKeeperServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperServer")
            .field("port", &self.port)
            .finish()
    }
}

impl ZooKeeperServer {
    /// Starts a standalone server and waits until it serves clients (well under a second here).
    ///
    /// # Errors
    /// When Java or the ZooKeeper jar is missing (the message says `apt-get install
    /// zookeeper`), or the server does not come up (the message includes its log).
    pub fn start() -> io::Result<ZooKeeperServer> {
        remove_leftover_dirs(DIR_PREFIX);
        let dir = TempDir::new(DIR_PREFIX)?;
        let members = Members::launch(1, dir.path(), None, None)?;
        Ok(ZooKeeperServer {
            port: members.members[0].client_port,
            inner: Mutex::new(members),
            _dir: dir,
        })
    }

    /// Starts a standalone server with `tickTime` `tick` and ZooKeeper's own session bounds
    /// (`minSessionTimeout` 2 ticks, `maxSessionTimeout` 20), as a server whose configuration
    /// sets only its tick has them: with a tick of 1 s no session is longer than 20 s.
    ///
    /// # Errors
    /// As for [`start`](Self::start).
    pub fn start_with_tick(tick: Duration) -> io::Result<ZooKeeperServer> {
        remove_leftover_dirs(DIR_PREFIX);
        let dir = TempDir::new(DIR_PREFIX)?;
        let members = Members::launch(1, dir.path(), None, Some(tick))?;
        Ok(ZooKeeperServer {
            port: members.members[0].client_port,
            inner: Mutex::new(members),
            _dir: dir,
        })
    }

    /// Starts a standalone server that also serves TLS on [`secure_port`](Self::secure_port)
    /// (the plain port stays, for the testkit's four-letter commands).
    ///
    /// # Errors
    /// As for [`start`](Self::start), and when the certificates cannot be read.
    pub fn start_tls(tls: ZooKeeperTls) -> io::Result<ZooKeeperServer> {
        remove_leftover_dirs(DIR_PREFIX);
        let dir = TempDir::new(DIR_PREFIX)?;
        let members = Members::launch(1, dir.path(), Some(&tls), None)?;
        Ok(ZooKeeperServer {
            port: members.members[0].client_port,
            inner: Mutex::new(members),
            _dir: dir,
        })
    }

    /// The TLS client port of a server started with [`start_tls`](Self::start_tls).
    pub fn secure_port(&self) -> Option<u16> {
        self.members().members[0].tls.as_ref().map(|(p, _)| *p)
    }

    /// `zks://localhost:<secure port>?ca_file=<ca>`, the TLS URL of a server started with
    /// [`start_tls`](Self::start_tls) (add `&cert_file=..&key_file=..` for a client
    /// certificate).
    pub fn tls_url(&self, ca_file: &Path) -> Option<String> {
        let port = self.secure_port()?;
        Some(format!(
            "zks://localhost:{port}?ca_file={}",
            ca_file.display()
        ))
    }

    /// One server for the whole test process, started on first use. Tests sharing it keep
    /// apart by their own roots (or prefixes); they must not stop it.
    ///
    /// # Errors
    /// As for [`start`](Self::start).
    pub fn shared() -> io::Result<Arc<ZooKeeperServer>> {
        static SHARED: OnceLock<Mutex<Option<Arc<ZooKeeperServer>>>> = OnceLock::new();
        super::shared(&SHARED, Self::start)
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Members> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The client port; it stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The client connect string, `127.0.0.1:port`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `zk://127.0.0.1:port`, for [`distlock::connect`].
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    member_controls!(single);

    /// Stops the process with `SIGSTOP`: connections stay open but nothing is answered.
    ///
    /// # Errors
    /// When the server is not running.
    pub fn pause(&self) -> io::Result<()> {
        self.members().members[0].signal(libc::SIGSTOP)
    }

    /// Continues a paused server (`SIGCONT`).
    ///
    /// # Errors
    /// When the server is not running.
    pub fn resume(&self) -> io::Result<()> {
        self.members().members[0].signal(libc::SIGCONT)
    }

    /// Sends a four-letter command (`ruok`, `srvr`, `cons`, `dump`, ...) and returns the answer.
    ///
    /// # Errors
    /// When the server does not answer.
    pub fn four_letter(&self, cmd: &str) -> io::Result<String> {
        four_letter(self.addr(), cmd)
    }
}

/// Several ZooKeeper servers on `127.0.0.1` forming one ensemble
/// (`server.N=127.0.0.1:quorumPort:electionPort`), each with its own ports and data directory.
/// Members can be stopped and started again one at a time. Member indexes are 0-based
/// (`myid` is index + 1).
pub struct ZooKeeperEnsemble {
    inner: Mutex<Members>,
    /// With [`start_partitionable`](Self::start_partitionable): the proxy each member reaches
    /// each other member's quorum port through, as `(from, to, proxy)`.
    links: Vec<(usize, usize, FaultProxy)>,
    _dir: TempDir,
}

impl fmt::Debug for ZooKeeperEnsemble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperEnsemble")
            .field("hosts", &self.connect_string())
            .finish()
    }
}

impl ZooKeeperEnsemble {
    /// Starts an `n`-server ensemble and waits until every member serves (a leader is
    /// elected).
    ///
    /// # Errors
    /// As for [`ZooKeeperServer::start`].
    pub fn start(n: usize) -> io::Result<ZooKeeperEnsemble> {
        if n < 2 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an ensemble needs at least two servers; use ZooKeeperServer for one",
            ));
        }
        remove_leftover_dirs(DIR_PREFIX);
        let dir = TempDir::new(DIR_PREFIX)?;
        let members = Members::launch(n, dir.path(), None, None)?;
        Ok(ZooKeeperEnsemble {
            inner: Mutex::new(members),
            links: Vec::new(),
            _dir: dir,
        })
    }

    /// Starts an `n`-server ensemble whose members reach each other's quorum port (the one a
    /// follower connects to its leader on) through a [`FaultProxy`] per direction, so that
    /// [`isolate`](Self::isolate) can cut one member off from the others while its clients
    /// still reach it. Elections use direct connections. The proxies run on the calling Tokio
    /// runtime, which must keep running (a multi-threaded one: start-up blocks a thread).
    ///
    /// # Errors
    /// As for [`start`](Self::start).
    pub async fn start_partitionable(n: usize) -> io::Result<ZooKeeperEnsemble> {
        if n < 2 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an ensemble needs at least two servers; use ZooKeeperServer for one",
            ));
        }
        java()?;
        remove_leftover_dirs(DIR_PREFIX);
        let dir = TempDir::new(DIR_PREFIX)?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            // Quorum ports first (the proxies need their targets), then the plan routes
            // through the proxies.
            let targets: Vec<u16> = (0..n).map(|_| free_port()).collect();
            let mut links = Vec::new();
            for from in 0..n {
                for (to, &port) in targets.iter().enumerate() {
                    if from != to {
                        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                        links.push((from, to, FaultProxy::start(target).await?));
                    }
                }
            }
            let route = |from: usize, to: usize, _: u16| {
                links
                    .iter()
                    .find(|(f, t, _)| *f == from && *t == to)
                    .map(|(_, _, p)| p.addr().port())
                    .expect("a proxy per direction")
            };
            let mut members = plan(n, dir.path(), &route);
            for (m, &quorum) in members.iter_mut().zip(&targets) {
                m.peer_ports.0 = quorum;
                let own = format!("server.{}=127.0.0.1:", m.id);
                for line in &mut m.servers {
                    if line.starts_with(&own) {
                        *line = format!("{own}{quorum}:{}", m.peer_ports.1);
                    }
                }
            }
            match tokio::task::spawn_blocking(move || Members::start(members))
                .await
                .map_err(io::Error::other)?
            {
                Ok(members) => {
                    return Ok(ZooKeeperEnsemble {
                        inner: Mutex::new(members),
                        links,
                        _dir: dir,
                    })
                }
                Err(e) if e.port_taken => last = Some(e.error),
                Err(e) => return Err(e.error),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("ZooKeeper did not start")))
    }

    /// Cuts member `i` off from the other members (of an ensemble started with
    /// [`start_partitionable`](Self::start_partitionable)): the quorum connections from and
    /// to it stall, as in a network partition; its clients still reach it. A follower cut off
    /// like this keeps answering reads from its own copy for up to [`SYNC_LIMIT`] ticks before
    /// it gives up on its leader.
    ///
    /// # Panics
    /// When the ensemble was not started with `start_partitionable`.
    pub fn isolate(&self, i: usize) {
        assert!(
            !self.links.is_empty(),
            "start the ensemble with start_partitionable"
        );
        for (from, to, p) in &self.links {
            if *from == i || *to == i {
                p.pause();
            }
        }
    }

    /// Ends every [`isolate`](Self::isolate).
    pub fn heal(&self) {
        for (_, _, p) in &self.links {
            p.resume();
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Members> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many servers the ensemble has.
    pub fn len(&self) -> usize {
        self.members().members.len()
    }

    /// Always false: an ensemble has at least two servers.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn connect_string(&self) -> String {
        self.members().connect_string()
    }

    /// `zk://127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// The client address of member `i`.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.members().members[i].addr()
    }

    member_controls!(cluster);

    /// `Some("leader" | "follower")` for a member that serves, `None` otherwise.
    pub fn mode(&self, i: usize) -> Option<String> {
        self.members().members[i].mode()
    }

    /// The index of the current leader.
    ///
    /// # Errors
    /// When no running member reports being the leader.
    pub fn leader(&self) -> io::Result<usize> {
        let m = self.members();
        (0..m.members.len())
            .find(|&i| m.members[i].mode().as_deref() == Some("leader"))
            .ok_or_else(|| io::Error::other("no ZooKeeper member is the leader"))
    }

    /// Waits until some running member is the leader and every running member serves again
    /// (after a member was stopped), at most `timeout`.
    ///
    /// # Errors
    /// When that does not happen in time.
    pub fn wait_serving(&self, timeout: Duration) -> io::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let ready = {
                let mut m = self.members();
                let running: Vec<usize> = (0..m.members.len())
                    .filter(|&i| m.members[i].is_running())
                    .collect();
                let modes: Vec<Option<String>> =
                    running.iter().map(|&i| m.members[i].mode()).collect();
                if modes.iter().all(Option::is_some) {
                    running
                        .iter()
                        .zip(&modes)
                        .find(|(_, mode)| mode.as_deref() == Some("leader"))
                        .map(|(i, _)| *i)
                } else {
                    None
                }
            };
            if let Some(leader) = ready {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the ensemble did not serve again within {timeout:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// Sends a four-letter command to member `i`.
    ///
    /// # Errors
    /// When it does not answer.
    pub fn four_letter(&self, i: usize, cmd: &str) -> io::Result<String> {
        four_letter(self.addr(i), cmd)
    }
}
