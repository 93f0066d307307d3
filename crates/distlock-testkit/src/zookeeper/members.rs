//! The server processes behind [`ZooKeeperServer`](super::ZooKeeperServer) and
//! [`ZooKeeperEnsemble`](super::ZooKeeperEnsemble): each member's configuration, process and
//! state, and starting a set of them on fresh ports.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::super::process;
use super::super::{free_port, spawn_tied_to_process};
use super::{
    four_letter, ZooKeeperTls, MAX_SESSION, PORT_ATTEMPTS, SYNC_LIMIT, TICK_TIME, ZOOKEEPER_JAR,
};

/// Optional logging binding for the server's slf4j (from `libslf4j-java`).
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty jars the Netty connection factory needs beyond those the ZooKeeper jar names.
const NETTY_EXTRA_JARS: [&str; 2] = [
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
];
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// How long a server (or an ensemble, to elect a leader) may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One server process of a standalone server or an ensemble.
#[derive(Debug)]
pub(super) struct Member {
    /// `myid` in an ensemble (1-based).
    pub(super) id: usize,
    pub(super) client_port: u16,
    /// The TLS client port and its settings, when the server serves TLS.
    pub(super) tls: Option<(u16, ZooKeeperTls)>,
    /// Quorum and election ports (ensemble only).
    pub(super) peer_ports: (u16, u16),
    /// Its `server.N=...` lines: where it finds every member (empty for a standalone server).
    pub(super) servers: Vec<String>,
    pub(super) dir: PathBuf,
    pub(super) child: Option<Child>,
    /// A `tickTime` other than the testkit's, with ZooKeeper's own session bounds (2 and 20
    /// ticks), as an unconfigured production server has them.
    pub(super) stock_tick: Option<Duration>,
}

impl Member {
    pub(super) fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub(super) fn cfg_path(&self) -> PathBuf {
        self.dir.join("zoo.cfg")
    }

    pub(super) fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    pub(super) fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }

    pub(super) fn is_running(&mut self) -> bool {
        process::is_running(&mut self.child)
    }

    pub(super) fn kill(&mut self) {
        process::kill(&mut self.child);
    }

    pub(super) fn signal(&self, signal: libc::c_int) -> io::Result<()> {
        process::signal(self.child.as_ref(), "ZooKeeper", signal)
    }

    pub(super) fn write_config(&self) -> io::Result<()> {
        let servers = &self.servers;
        std::fs::create_dir_all(self.data_dir())?;
        let sessions = match self.stock_tick {
            Some(_) => String::new(),
            None => format!(
                "minSessionTimeout=200\nmaxSessionTimeout={}\n",
                MAX_SESSION.as_millis()
            ),
        };
        let mut cfg = format!(
            "tickTime={}\n\
             initLimit=100\n\
             syncLimit={}\n\
             dataDir={}\n\
             clientPort={}\n\
             clientPortAddress=127.0.0.1\n\
             {sessions}\
             forceSync=no\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=*\n\
             reconfigEnabled=false\n\
             standaloneEnabled=true\n",
            self.stock_tick.unwrap_or(TICK_TIME).as_millis(),
            SYNC_LIMIT,
            self.data_dir().display(),
            self.client_port,
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
    pub(super) fn spawn(&mut self) -> io::Result<()> {
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
        let log = process::open_log(&self.log_path())?;
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
        .stdout(log.stdout)
        .stderr(log.stderr);
        self.child = Some(spawn_tied_to_process(cmd)?);
        Ok(())
    }

    /// The server's answer to a four-letter command, `""` when it does not answer.
    pub(super) fn four(&self, cmd: &str) -> String {
        four_letter(self.addr(), cmd).unwrap_or_default()
    }

    /// `Some("standalone" | "leader" | "follower")` once it serves clients.
    pub(super) fn mode(&self) -> Option<String> {
        let srvr = self.four("srvr");
        srvr.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    }

    pub(super) fn log_tail(&self) -> String {
        process::read_log(&self.log_path(), 0)
    }

    /// Whether the server failed because another process has one of its ports.
    pub(super) fn port_taken(&self) -> bool {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        log.contains("Address already in use") || log.contains("BindException")
    }
}

pub(super) fn java() -> io::Result<PathBuf> {
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
pub(super) struct Members {
    pub(super) members: Vec<Member>,
}

/// Members with fresh ports, not started; `route(from, to, quorum_port)` is the quorum port
/// member `from` uses to reach member `to` (the port itself, or a proxy's).
pub(super) fn plan(n: usize, dir: &Path, route: &dyn Fn(usize, usize, u16) -> u16) -> Vec<Member> {
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
            stock_tick: None,
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
pub(super) struct StartError {
    pub(super) error: io::Error,
    pub(super) port_taken: bool,
}

impl Members {
    pub(super) fn launch(
        n: usize,
        dir: &Path,
        tls: Option<&ZooKeeperTls>,
        stock_tick: Option<Duration>,
    ) -> io::Result<Members> {
        java()?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let mut members = plan(n, dir, &|_, _, port| port);
            for m in &mut members {
                m.stock_tick = stock_tick;
            }
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
    pub(super) fn start(mut members: Vec<Member>) -> std::result::Result<Members, StartError> {
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
    pub(super) fn wait_serving(&mut self, ids: &[usize]) -> io::Result<()> {
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

    pub(super) fn restart(&mut self, i: usize) -> io::Result<()> {
        self.members[i].kill();
        self.members[i].write_config()?;
        self.members[i].spawn()?;
        self.wait_serving(&[i])
    }

    pub(super) fn kill_all(&mut self) {
        for m in &mut self.members {
            m.kill();
        }
    }

    pub(super) fn connect_string(&self) -> String {
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
