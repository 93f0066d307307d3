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
use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::proxy::FaultProxy;
use super::{free_port, remove_leftover_dirs, spawn_tied_to_process, TempDir};

/// The server jar of Debian's `libzookeeper-java` (a dependency of `zookeeper`).
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// Optional logging binding for the server's slf4j (from `libslf4j-java`).
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty jars the Netty connection factory needs beyond those the ZooKeeper jar names.
const NETTY_EXTRA_JARS: [&str; 2] = [
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
];
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
const DIR_PREFIX: &str = "distlock-testkit-zk";
/// How long a server (or an ensemble, to elect a leader) may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(60);
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

/// One server process of a standalone server or an ensemble.
#[derive(Debug)]
struct Member {
    /// `myid` in an ensemble (1-based).
    id: usize,
    client_port: u16,
    /// The TLS client port and its settings, when the server serves TLS.
    tls: Option<(u16, ZooKeeperTls)>,
    /// Quorum and election ports (ensemble only).
    peer_ports: (u16, u16),
    /// Its `server.N=...` lines: where it finds every member (empty for a standalone server).
    servers: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl Member {
    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn cfg_path(&self) -> PathBuf {
        self.dir.join("zoo.cfg")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }

    fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, signal: libc::c_int) -> io::Result<()> {
        let pid =
            self.child.as_ref().map(Child::id).ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "ZooKeeper is not running")
            })?;
        let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our unreaped child.
        if unsafe { libc::kill(pid, signal) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn write_config(&self) -> io::Result<()> {
        let servers = &self.servers;
        std::fs::create_dir_all(self.data_dir())?;
        let mut cfg = format!(
            "tickTime={}\n\
             initLimit=100\n\
             syncLimit={}\n\
             dataDir={}\n\
             clientPort={}\n\
             clientPortAddress=127.0.0.1\n\
             minSessionTimeout=200\n\
             maxSessionTimeout={}\n\
             forceSync=no\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=*\n\
             reconfigEnabled=false\n\
             standaloneEnabled=true\n",
            TICK_TIME.as_millis(),
            SYNC_LIMIT,
            self.data_dir().display(),
            self.client_port,
            MAX_SESSION.as_millis()
        );
        if let Some((port, tls)) = &self.tls {
            // One PEM file with the key and the certificate: ZooKeeper's PEM key store.
            let mut pem = std::fs::read_to_string(&tls.key)?;
            if !pem.ends_with('\n') {
                pem.push('\n');
            }
            pem.push_str(&std::fs::read_to_string(&tls.cert)?);
            let store = self.dir.join("server.pem");
            std::fs::write(&store, pem)?;
            // Settings unknown to zoo.cfg become `zookeeper.`-prefixed system properties.
            cfg.push_str(&format!(
                "secureClientPort={port}\n\
                 secureClientPortAddress=127.0.0.1\n\
                 serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 ssl.keyStore.location={}\n\
                 ssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={}\n\
                 ssl.trustStore.type=PEM\n\
                 ssl.clientAuth={}\n",
                store.display(),
                tls.ca.display(),
                if tls.need_client_auth { "need" } else { "none" }
            ));
        }
        for s in servers {
            cfg.push_str(s);
            cfg.push('\n');
        }
        std::fs::write(self.cfg_path(), cfg)?;
        if !servers.is_empty() {
            std::fs::write(self.data_dir().join("myid"), format!("{}\n", self.id))?;
        }
        Ok(())
    }

    /// Starts the process (the configuration must be written).
    fn spawn(&mut self) -> io::Result<()> {
        self.kill();
        let java = java()?;
        let mut cp = ZOOKEEPER_JAR.to_owned();
        if Path::new(SLF4J_SIMPLE_JAR).is_file() {
            cp.push(':');
            cp.push_str(SLF4J_SIMPLE_JAR);
        }
        if self.tls.is_some() {
            // The Netty connection factory (TLS) needs netty's codec, which the jar's manifest
            // does not name (Debian's `libnetty-java`, a dependency of `zookeeper`).
            for jar in NETTY_EXTRA_JARS {
                if Path::new(jar).is_file() {
                    cp.push(':');
                    cp.push_str(jar);
                }
            }
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let log_err = log.try_clone()?;
        let mut cmd = Command::new(java);
        cmd.args([
            "-Xmx192m",
            "-Xss512k",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true",
            "-Dznode.container.checkIntervalMs=200",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
        ])
        .arg(format!("-Dzookeeper.log.dir={}", self.dir.display()))
        .arg("-cp")
        .arg(cp)
        .arg(MAIN_CLASS)
        .arg(self.cfg_path())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err));
        self.child = Some(spawn_tied_to_process(cmd)?);
        Ok(())
    }

    /// The server's answer to a four-letter command, `""` when it does not answer.
    fn four(&self, cmd: &str) -> String {
        four_letter(self.addr(), cmd).unwrap_or_default()
    }

    /// `Some("standalone" | "leader" | "follower")` once it serves clients.
    fn mode(&self) -> Option<String> {
        let srvr = self.four("srvr");
        srvr.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Whether the server failed because another process has one of its ports.
    fn port_taken(&self) -> bool {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        log.contains("Address already in use") || log.contains("BindException")
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

fn java() -> io::Result<PathBuf> {
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{ZOOKEEPER_JAR} not found: install ZooKeeper with `apt-get install zookeeper` \
                 (scripts/test.sh installs it); server-backed tests never skip"
            ),
        ));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("java"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "`java` not found on PATH: install it with `apt-get install zookeeper` (which \
                 brings a Java runtime) or `apt-get install default-jre-headless`",
            )
        })
}

/// The processes of one server or ensemble.
#[derive(Debug)]
struct Members {
    members: Vec<Member>,
}

/// Members with fresh ports, not started; `route(from, to, quorum_port)` is the quorum port
/// member `from` uses to reach member `to` (the port itself, or a proxy's).
fn plan(n: usize, dir: &Path, route: &dyn Fn(usize, usize, u16) -> u16) -> Vec<Member> {
    let mut members: Vec<Member> = (1..=n)
        .map(|id| Member {
            id,
            client_port: free_port(),
            tls: None,
            peer_ports: if n > 1 {
                (free_port(), free_port())
            } else {
                (0, 0)
            },
            servers: Vec::new(),
            dir: dir.join(format!("server{id}")),
            child: None,
        })
        .collect();
    if n > 1 {
        let ports: Vec<(u16, u16)> = members.iter().map(|m| m.peer_ports).collect();
        for (from, m) in members.iter_mut().enumerate() {
            m.servers = ports
                .iter()
                .enumerate()
                .map(|(to, &(quorum, election))| {
                    let quorum = if to == from {
                        quorum
                    } else {
                        route(from, to, quorum)
                    };
                    format!("server.{}=127.0.0.1:{quorum}:{election}", to + 1)
                })
                .collect();
        }
    }
    members
}

/// Whether starting failed because another process had one of the ports (worth another try
/// with fresh ports).
struct StartError {
    error: io::Error,
    port_taken: bool,
}

impl Members {
    fn launch(n: usize, dir: &Path, tls: Option<&ZooKeeperTls>) -> io::Result<Members> {
        java()?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let mut members = plan(n, dir, &|_, _, port| port);
            if let Some(tls) = tls {
                for m in &mut members {
                    m.tls = Some((free_port(), tls.clone()));
                }
            }
            match Members::start(members) {
                Ok(all) => return Ok(all),
                Err(e) if e.port_taken => last = Some(e.error),
                Err(e) => return Err(e.error),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("ZooKeeper did not start")))
    }

    /// Starts planned members and waits until all serve.
    fn start(mut members: Vec<Member>) -> std::result::Result<Members, StartError> {
        let fail = |error| StartError {
            error,
            port_taken: false,
        };
        for m in &mut members {
            let _ = std::fs::remove_dir_all(&m.dir);
            m.write_config().map_err(fail)?;
            m.spawn().map_err(fail)?;
        }
        let mut all = Members { members };
        let ids: Vec<usize> = (0..all.members.len()).collect();
        match all.wait_serving(&ids) {
            Ok(()) => Ok(all),
            Err(error) => {
                let port_taken = all.members.iter().any(Member::port_taken);
                all.kill_all();
                Err(StartError { error, port_taken })
            }
        }
    }

    /// Waits until the members `ids` serve clients (an ensemble member only does once a
    /// quorum elected a leader).
    fn wait_serving(&mut self, ids: &[usize]) -> io::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let mut pending = Vec::new();
            for &i in ids {
                let m = &mut self.members[i];
                if !m.is_running() {
                    return Err(io::Error::other(format!(
                        "ZooKeeper server {} (port {}) exited during start-up; its log:\n{}",
                        m.id,
                        m.client_port,
                        m.log_tail()
                    )));
                }
                if m.mode().is_none() {
                    pending.push(i);
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let m = &self.members[pending[0]];
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "ZooKeeper server {} (port {}) did not serve within {START_TIMEOUT:?}; \
                         its log:\n{}",
                        m.id,
                        m.client_port,
                        m.log_tail()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    fn restart(&mut self, i: usize) -> io::Result<()> {
        self.members[i].kill();
        self.members[i].write_config()?;
        self.members[i].spawn()?;
        self.wait_serving(&[i])
    }

    fn kill_all(&mut self) {
        for m in &mut self.members {
            m.kill();
        }
    }

    fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// A standalone ZooKeeper server on `127.0.0.1` at a free port, with its own data directory.
///
/// All methods take `&self`, so one server can be shared (see [`shared`](Self::shared)). The
/// data survives [`kill`](Self::kill) and [`restart`](Self::restart) (sessions included: a
/// client that reconnects in time keeps its session). Dropping it kills the process and removes
/// the directory.
///
/// ```no_run
/// use distlock::testkit::zookeeper::ZooKeeperServer;
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
        let members = Members::launch(1, dir.path(), None)?;
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
        let members = Members::launch(1, dir.path(), Some(&tls))?;
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

    /// `zk://127.0.0.1:port`, for [`distlock::connect`](crate::connect).
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// Whether the process is alive (it may be paused).
    pub fn is_running(&self) -> bool {
        self.members().members[0].is_running()
    }

    /// Kills the server with `SIGKILL`, as in a crash. Does nothing if it is not running.
    pub fn kill(&self) {
        self.members().members[0].kill();
    }

    /// Starts the server again on the same port with the same data (killing it first if it
    /// runs) and waits until it serves.
    ///
    /// # Errors
    /// When it does not come back (for instance because another process took the port).
    pub fn restart(&self) -> io::Result<()> {
        self.members().restart(0)
    }

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
        let members = Members::launch(n, dir.path(), None)?;
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

    /// Whether member `i`'s process is alive.
    pub fn is_running(&self, i: usize) -> bool {
        self.members().members[i].is_running()
    }

    /// Kills member `i` with `SIGKILL`.
    pub fn kill(&self, i: usize) {
        self.members().members[i].kill();
    }

    /// Starts member `i` again with its ports and data and waits until it serves (which needs
    /// a quorum of running members).
    ///
    /// # Errors
    /// When it does not come back.
    pub fn restart(&self, i: usize) -> io::Result<()> {
        self.members().restart(i)
    }

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
