//! Throwaway etcd servers (Debian `etcd-server`, etcd 3.4) on free loopback ports, for tests
//! that need a real etcd: one node ([`EtcdServer`]) or a cluster ([`EtcdCluster`]).
//!
//! Every member runs in its own temporary directory (data directory and log; in `/dev/shm` when
//! the machine has it), listens on a free client port and a free peer port of `127.0.0.1`, and
//! dies with the test process, even one that is killed. A member can be killed (`SIGKILL`, as
//! in a crash) and started again on the same ports with the same data directory: etcd keeps
//! its data (and its leases) across that, as a real deployment does. A start checks that the
//! server answering on the port is its own (another test may have taken the port first).
//! Missing binaries are an error that says what to install, never a skip.
//!
//! ```no_run
//! use distlock_testkit::etcd::EtcdServer;
//! let server = EtcdServer::start()?;
//! println!("{}", server.url()); // etcd://127.0.0.1:PORT
//! server.etcdctl(&["put", "k", "v"])?;
//! server.kill();
//! server.restart()?; // same port, same data
//! assert_eq!(server.etcdctl(&["get", "k", "--print-value-only"])?.trim(), "v");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::process::{self, read_log, spawn_error};
use super::{free_port, remove_leftover_dirs, spawn_tied_to_process, TempDir};

/// The server binary, looked up on `PATH` (Debian package `etcd-server`).
const BINARY: &str = "etcd";
/// The command-line client, looked up on `PATH` (Debian package `etcd-client`).
const CTL: &str = "etcdctl";
/// How long a starting member (or cluster) may take to report healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a start is retried on fresh ports when another process took a free one first.
const PORT_ATTEMPTS: usize = 5;

/// Settings for [`EtcdServer::start_with`] and [`EtcdCluster::start_with`].
#[derive(Debug, Clone, Default)]
pub struct EtcdServerOptions {
    /// Serve clients over TLS with these PEM files: the client URLs become `https://` and
    /// [`EtcdServer::url`] `etcds://`.
    pub tls: Option<TlsFiles>,
    /// Raft heartbeat interval and election timeout. Default: 50 ms / 500 ms for one node
    /// (quick start, minimum lease TTL of one second), 100 ms / 1 s (etcd's own defaults)
    /// for a cluster, which must not hold elections just because a loaded test machine is slow.
    pub timing: Option<(Duration, Duration)>,
}

/// The certificate files of a TLS server.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The server's certificate (PEM), valid for `127.0.0.1`.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The authority that signed it (PEM); `etcdctl` trusts it.
    pub ca: PathBuf,
}

/// One etcd process: its ports, directories and (while running) its child process.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    log_start: u64,
}

impl Member {
    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    fn client_url(&self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn is_running(&mut self) -> bool {
        process::is_running(&mut self.child)
    }

    fn kill(&mut self) {
        process::kill(&mut self.child);
    }

    fn spawn(
        &mut self,
        initial_cluster: &str,
        token: &str,
        opts: &EtcdServerOptions,
        timing: (Duration, Duration),
    ) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let log = process::open_log(&self.log_path())?;
        self.log_start = log.start;
        let tls = opts.tls.is_some();
        let mut command = Command::new(BINARY);
        command
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--listen-client-urls")
            .arg(self.client_url(tls))
            .arg("--advertise-client-urls")
            .arg(self.client_url(tls))
            .arg("--listen-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-cluster")
            .arg(initial_cluster)
            .args(["--initial-cluster-state", "new"])
            .arg("--initial-cluster-token")
            .arg(token)
            .arg("--heartbeat-interval")
            .arg(timing.0.as_millis().to_string())
            .arg("--election-timeout")
            .arg(timing.1.as_millis().to_string())
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "warn"])
            .args(["--enable-v2=false", "--snapshot-count", "10000"])
            .env_remove("ETCD_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(log.stdout)
            .stderr(log.stderr);
        if let Some(t) = &opts.tls {
            command
                .arg("--cert-file")
                .arg(&t.cert)
                .arg("--key-file")
                .arg(&t.key);
        }
        self.child = Some(
            spawn_tied_to_process(command).map_err(|e| spawn_error(BINARY, "etcd-server", e))?,
        );
        Ok(())
    }

    /// The member's output since its last start.
    fn log(&self) -> String {
        read_log(&self.log_path(), self.log_start)
    }

    /// `Some(error)` when the process exited (it is then forgotten).
    fn exited(&mut self) -> Option<io::Error> {
        let status = process::exit_status(&mut self.child)?;
        let log = self.log();
        let kind = if log.contains("address already in use") {
            io::ErrorKind::AddrInUse
        } else {
            io::ErrorKind::Other
        };
        Some(io::Error::new(
            kind,
            format!(
                "etcd member {} (client port {}) exited ({status}); its output:\n{log}",
                self.name, self.client_port
            ),
        ))
    }
}

/// A member set with shared settings: the body of both [`EtcdServer`] and [`EtcdCluster`].
#[derive(Debug)]
struct Members {
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    opts: EtcdServerOptions,
    timing: (Duration, Duration),
}

impl Members {
    fn launch(n: usize, opts: EtcdServerOptions, root: &Path) -> io::Result<Members> {
        let timing = opts.timing.unwrap_or(if n == 1 {
            (Duration::from_millis(50), Duration::from_millis(500))
        } else {
            (Duration::from_millis(100), Duration::from_millis(1000))
        });
        let mut last = None;
        for attempt in 0..PORT_ATTEMPTS {
            let mut members: Vec<Member> = (0..n)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: free_port(),
                    peer_port: free_port(),
                    dir: root.join(format!("a{attempt}-m{i}")),
                    child: None,
                    log_start: 0,
                })
                .collect();
            let initial_cluster = members
                .iter()
                .map(|m| format!("{}={}", m.name, m.peer_url()))
                .collect::<Vec<_>>()
                .join(",");
            let token = format!("distlock-{:016x}", rand::random::<u64>());
            let mut set = Members {
                members: Vec::new(),
                initial_cluster,
                token,
                opts: opts.clone(),
                timing,
            };
            let mut spawned = Ok(());
            for m in &mut members {
                spawned = m.spawn(&set.initial_cluster, &set.token, &set.opts, timing);
                if spawned.is_err() {
                    break;
                }
            }
            set.members = members;
            let res = spawned.and_then(|()| set.wait_healthy(&(0..n).collect::<Vec<_>>()));
            match res {
                Ok(()) => return Ok(set),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    set.kill_all();
                    last = Some(e);
                }
                Err(e) => {
                    set.kill_all();
                    return Err(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("etcd did not start")))
    }

    fn kill_all(&mut self) {
        for m in &mut self.members {
            m.kill();
        }
    }

    /// Waits until each of `which` answers `/health` with a leader.
    fn wait_healthy(&mut self, which: &[usize]) -> io::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let tls = self.opts.tls.clone();
        for &i in which {
            loop {
                if let Some(e) = self.members[i].exited() {
                    return Err(e);
                }
                // Healthy, and ours: another test's etcd may have taken the port first.
                let m = &self.members[i];
                let healthy = match &tls {
                    None => {
                        http_health(m.client_port) && http_is_member(m.client_port, m.peer_port)
                    }
                    Some(t) => ctl_health(&m.client_url(true), &t.ca, m.peer_port),
                };
                if healthy {
                    break;
                }
                if Instant::now() >= deadline {
                    let log = self.members[i].log();
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "etcd member {} did not become healthy within {START_TIMEOUT:?}; \
                             its output:\n{log}",
                            self.members[i].name
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    fn endpoints(&self) -> Vec<String> {
        let tls = self.opts.tls.is_some();
        self.members.iter().map(|m| m.client_url(tls)).collect()
    }

    fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "etcds"
        } else {
            "etcd"
        };
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("{scheme}://{}", hosts.join(","))
    }

    fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> io::Result<String> {
        let mut cmd = Command::new(CTL);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .args(["--dial-timeout=3s", "--command-timeout=10s"]);
        if let Some(t) = &self.opts.tls {
            cmd.arg("--cacert").arg(&t.ca);
        }
        cmd.args(args).stdin(Stdio::null());
        let out = cmd.output().map_err(ctl_error)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "etcdctl {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// Starts member `i` again on its ports with its data and waits until it is healthy
    /// (which, in a cluster, needs a quorum of running members).
    fn restart(&mut self, i: usize) -> io::Result<()> {
        self.members[i].kill();
        let (ic, token, opts, timing) = (
            self.initial_cluster.clone(),
            self.token.clone(),
            self.opts.clone(),
            self.timing,
        );
        self.members[i].spawn(&ic, &token, &opts, timing)?;
        self.wait_healthy(&[i])
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// A single-node etcd on `127.0.0.1`, with its own data directory.
///
/// All methods take `&self`, so one server can be shared (see [`shared`](Self::shared)).
/// Dropping it kills the process and removes its directory.
#[derive(Debug)]
pub struct EtcdServer {
    inner: Mutex<Members>,
    endpoint: String,
    url: String,
    _dir: TempDir,
}

impl EtcdServer {
    /// Starts a plain (no TLS, no auth) single-node server and waits until it is healthy.
    ///
    /// # Errors
    /// When `etcd` is not installed (the message says `apt-get install etcd-server`), or it
    /// does not become healthy within 30 seconds (the message includes its output).
    pub fn start() -> io::Result<EtcdServer> {
        Self::start_with(EtcdServerOptions::default())
    }

    /// Starts a server that serves TLS with the server certificate of `ca` (its clients
    /// trust `ca`'s authority), and waits until it is healthy.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_tls(ca: &super::tls::TestCa) -> io::Result<EtcdServer> {
        let (cert, key) = ca.server_cert_and_key();
        Self::start_with(EtcdServerOptions {
            tls: Some(TlsFiles {
                cert,
                key,
                ca: ca.ca_cert(),
            }),
            ..EtcdServerOptions::default()
        })
    }

    /// Starts a single-node server configured by `options`.
    ///
    /// # Errors
    /// As for [`start`](Self::start).
    pub fn start_with(options: EtcdServerOptions) -> io::Result<EtcdServer> {
        let dir = data_root("distlock-testkit-etcd")?;
        let members = Members::launch(1, options, dir.path())?;
        Ok(EtcdServer {
            endpoint: members.endpoints()[0].clone(),
            url: members.url(),
            inner: Mutex::new(members),
            _dir: dir,
        })
    }

    /// One plain server for the whole test process, started on first use. Tests that share it
    /// keep apart by using their own key prefixes; they must not stop it.
    ///
    /// # Errors
    /// As for [`start`](Self::start).
    pub fn shared() -> io::Result<Arc<EtcdServer>> {
        static SHARED: OnceLock<Mutex<Option<Arc<EtcdServer>>>> = OnceLock::new();
        super::shared(&SHARED, Self::start)
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Members> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `etcd://127.0.0.1:PORT` (`etcds://` with TLS), for [`distlock::connect`].
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The client URL, `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The client port; it stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.members().members[0].client_port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()))
    }

    member_controls!(single);

    /// Runs `etcdctl --endpoints=<this server> ARGS` (API v3, with the CA under TLS) and returns
    /// its standard output. Pass `--user=root:PASSWORD` in `args` once auth is enabled.
    ///
    /// # Errors
    /// When `etcdctl` is missing (the message says `apt-get install etcd-client`) or fails (the
    /// message has its output).
    pub fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        let m = self.members();
        let eps = m.endpoints();
        m.etcdctl(&eps, args)
    }
}

/// Several etcd members on `127.0.0.1` forming one cluster, each with its own ports and data
/// directory. Members can be stopped and started again one at a time.
#[derive(Debug)]
pub struct EtcdCluster {
    inner: Mutex<Members>,
    _dir: TempDir,
}

impl EtcdCluster {
    /// Starts an `n`-member cluster and waits until every member is healthy.
    ///
    /// # Errors
    /// As for [`EtcdServer::start`].
    pub fn start(n: usize) -> io::Result<EtcdCluster> {
        Self::start_with(n, EtcdServerOptions::default())
    }

    /// Starts an `n`-member cluster configured by `options`.
    ///
    /// # Errors
    /// As for [`EtcdServer::start`].
    pub fn start_with(n: usize, options: EtcdServerOptions) -> io::Result<EtcdCluster> {
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one member",
            ));
        }
        let dir = data_root("distlock-testkit-etcd-cluster")?;
        let members = Members::launch(n, options, dir.path())?;
        Ok(EtcdCluster {
            inner: Mutex::new(members),
            _dir: dir,
        })
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Members> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members().members.len()
    }

    /// Never true: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,...` with every member.
    pub fn url(&self) -> String {
        self.members().url()
    }

    /// The client URL of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members().endpoints()
    }

    member_controls!(cluster);

    /// The index of the member that currently leads, asked of the running members.
    ///
    /// # Errors
    /// When no running member reports a leader.
    pub fn leader(&self) -> io::Result<usize> {
        let mut m = self.members();
        let eps = m.endpoints();
        let running: Vec<usize> = (0..m.members.len())
            .filter(|&i| m.members[i].is_running())
            .collect();
        let mut last = io::Error::other("no member is running");
        for &i in &running {
            match m.etcdctl(
                std::slice::from_ref(&eps[i]),
                &["endpoint", "status", "-w", "fields"],
            ) {
                Ok(out) => {
                    let field = |name: &str| {
                        out.lines()
                            .find(|l| l.trim_start().starts_with(&format!("\"{name}\"")))
                            .and_then(|l| l.rsplit(':').next())
                            .map(|v| v.trim().to_owned())
                    };
                    if let (Some(me), Some(leader)) = (field("MemberID"), field("Leader")) {
                        if me == leader {
                            return Ok(i);
                        }
                    }
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Runs `etcdctl` against every member (see [`EtcdServer::etcdctl`]).
    ///
    /// # Errors
    /// As for [`EtcdServer::etcdctl`].
    pub fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        let m = self.members();
        let eps = m.endpoints();
        m.etcdctl(&eps, args)
    }
}

/// A temporary directory for data: in `/dev/shm` (memory, where etcd's fsyncs cost nothing)
/// when the machine has it, else in the system's temporary directory.
fn data_root(prefix: &str) -> io::Result<TempDir> {
    // Each data directory holds ~120 MB of preallocated WAL: a dead process's must go first.
    remove_leftover_dirs(prefix);
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let probe = TempDir::new(prefix)?;
        let name = probe.path().file_name().map(|n| n.to_owned());
        if let Some(name) = name {
            let path = shm.join(name);
            if std::fs::create_dir_all(&path).is_ok() {
                return Ok(TempDir { path });
            }
        }
        return Ok(probe);
    }
    TempDir::new(prefix)
}

/// One HTTP/1.0 request to the member's client port; the whole response as text.
fn http(port: u16, request: &str) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    Some(body)
}

/// `GET /health` over plain HTTP: true when the member answers with a leader.
fn http_health(port: u16) -> bool {
    http(port, "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_some_and(|b| b.contains("\"health\":\"true\""))
}

/// Whether the server on `port` belongs to the cluster whose member has `peer_port`.
fn http_is_member(port: u16, peer_port: u16) -> bool {
    let body = "{}";
    let req = format!(
        "POST /v3/cluster/member/list HTTP/1.0\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http(port, &req).is_some_and(|b| b.contains(&format!("127.0.0.1:{peer_port}\"")))
}

/// `etcdctl endpoint health` and `member list` for TLS members.
fn ctl_health(endpoint: &str, ca: &Path, peer_port: u16) -> bool {
    let ctl = |args: &[&str]| {
        Command::new(CTL)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .arg("--cacert")
            .arg(ca)
            .args(["--dial-timeout=1s", "--command-timeout=2s"])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    ctl(&["endpoint", "health"]).is_some()
        && ctl(&["member", "list"]).is_some_and(|o| o.contains(&format!("127.0.0.1:{peer_port}")))
}

fn ctl_error(error: io::Error) -> io::Error {
    spawn_error(CTL, "etcd-client", error)
}
