//! A throwaway `redis-server` on a free loopback port, for tests that need a real Redis.
//!
//! Each [`RedisServer`] owns its process, port and temporary directory: nothing is shared with the
//! machine's own Redis (if any runs on 6379) or with other tests. Persistence is off, so a
//! [`restart`](RedisServer::restart) always comes back empty, which is what a crash of an
//! unpersisted master looks like to a lock client.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

pub mod cluster;
pub mod sentinel;

use ::redis::{ConnectionLike, IntoConnectionInfo, Value};

use super::process::{self, read_log, spawn_error};
use super::{free_port, spawn_tied_to_process, TempDir};

/// The binary that is started, looked up on `PATH`.
const BINARY: &str = "redis-server";
/// How long a starting server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How often `start` tries a new port when another process took the free one first.
const PORT_ATTEMPTS: usize = 5;
/// Read timeout of [`RedisServer::cli`]; long enough for a `DEBUG SLEEP` of several seconds.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings for [`RedisServer::start_with`].
///
/// The default is an open server: no password, no extra user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisServerOptions {
    /// Password of the `default` user (`requirepass`). Unauthenticated commands get `-NOAUTH`.
    pub password: Option<String>,
    /// An extra ACL user `(name, password)` allowed every key, channel and command
    /// (`on >password ~* &* +@all`). When set, [`RedisServer::url`] logs in as this user.
    pub acl_user: Option<(String, String)>,
    /// Start as a replica of the server on this loopback port (`--replicaof 127.0.0.1 PORT`).
    pub replica_of: Option<u16>,
    /// The password of the master that this replica, or this Sentinel, follows (`masterauth`,
    /// `sentinel auth-pass`). A server with a [`password`](Self::password) of its own also
    /// takes it as `masterauth` when this is unset, so that it can follow any master of its
    /// set after a failover.
    pub master_password: Option<String>,
    /// Start as a Sentinel (`--sentinel`) that monitors the master on this loopback port under
    /// [`sentinel::MASTER`] with quorum 2 (see [`sentinel::SentinelSet`]).
    pub sentinel_of: Option<u16>,
    /// Start as a Redis Cluster node (`--cluster-enabled yes`, node timeout
    /// [`cluster::NODE_TIMEOUT`]), not yet part of any cluster (see [`cluster::ClusterSet`]).
    /// Its `nodes.conf` lives beside the data directory, so a [`RedisServer::restart`] comes
    /// back empty but as the same node, as a crashed unpersisted node does.
    pub cluster: bool,
    /// Also listen for TLS on a port of its own ([`RedisServer::tls_port`]), with
    /// `server.crt`, `server.key` and `ca.crt` from this directory (a
    /// [`TestCa`](crate::tls::TestCa)'s, which must outlive the server). Replication,
    /// Sentinel's links and the cluster bus then go over TLS too (`tls-replication`,
    /// `tls-cluster`), so [`replica_of`](Self::replica_of) and
    /// [`sentinel_of`](Self::sentinel_of) name TLS ports. The plain port stays open for
    /// [`RedisServer::cli`].
    pub tls: Option<PathBuf>,
}

/// A private `redis-server` process listening on `127.0.0.1` at a free port.
///
/// Started with `--save "" --appendonly no` in its own temporary directory, so it keeps nothing
/// across [`kill`](Self::kill) and [`restart`](Self::restart). Dropping it kills the process
/// (`SIGKILL`), waits for it and removes the directory.
///
/// The methods block the calling thread (starting waits up to about ten seconds for the server to
/// answer); that is fine inside `#[tokio::test]` bodies.
///
/// ```no_run
/// use distlock_testkit::redis::RedisServer;
///
/// let mut server = RedisServer::start()?;
/// assert_eq!(server.cli(&["SET", "k", "v"])?, "OK");
/// server.restart()?; // same port, empty data
/// assert_eq!(server.cli(&["GET", "k"])?, "(nil)");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisServer {
    binary: String,
    options: RedisServerOptions,
    port: u16,
    /// With [`RedisServerOptions::tls`]: the TLS port.
    tls_port: Option<u16>,
    dir: TempDir,
    child: Option<Child>,
}

/// Why one launch attempt failed.
enum LaunchError {
    /// Another process took the port between [`free_port`] and the server's bind.
    PortTaken(io::Error),
    /// Anything else; retrying on another port will not help.
    Failed(io::Error),
}

impl RedisServer {
    /// Starts an open server (no password) and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// Fails if `redis-server` is not installed (the message says to run
    /// `apt-get install redis-server`), if it exits during start-up (the message includes its
    /// log), or if it does not answer within about ten seconds.
    pub fn start() -> io::Result<RedisServer> {
        Self::start_with(RedisServerOptions::default())
    }

    /// Starts a server configured by `options` and waits until it answers `PING`
    /// (or `-NOAUTH`, which proves it is up just as well).
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub fn start_with(options: RedisServerOptions) -> io::Result<RedisServer> {
        Self::start_binary(BINARY, options)
    }

    fn start_binary(binary: &str, options: RedisServerOptions) -> io::Result<RedisServer> {
        let mut server = RedisServer {
            binary: binary.to_owned(),
            options,
            port: 0,
            tls_port: None,
            dir: TempDir::new("distlock-testkit-redis")?,
            child: None,
        };
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            // A cluster node's bus listens 10,000 ports above its client port (the TLS port
            // with `tls-cluster`), and Redis refuses to start if that is beyond 65535.
            let limit = if server.options.cluster {
                55535
            } else {
                u16::MAX
            };
            let pick = |not: u16| loop {
                let p = free_port();
                if p <= limit && p != not {
                    break p;
                }
            };
            server.port = pick(0);
            if server.options.tls.is_some() {
                server.tls_port = Some(pick(server.port));
            }
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(LaunchError::PortTaken(e)) => last_error = Some(e),
                Err(LaunchError::Failed(e)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    /// The TCP port the server listens on; it stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port, with [`RedisServerOptions::tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The port clients, replicas and Sentinels use: the TLS port if there is one, else
    /// [`port`](Self::port).
    pub fn data_port(&self) -> u16 {
        self.tls_port().unwrap_or(self.port)
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The connection URL: `redis://127.0.0.1:port`, with `user:password@` for the
    /// [`acl_user`](RedisServerOptions::acl_user) if one is configured, else `:password@` for the
    /// default user's [`password`](RedisServerOptions::password) if one is set.
    pub fn url(&self) -> String {
        match (&self.options.acl_user, &self.options.password) {
            (Some((user, pass)), _) => self.url_with(Some(user), Some(pass)),
            (None, Some(pass)) => self.url_with(None, Some(pass)),
            (None, None) => self.url_with(None, None),
        }
    }

    /// A URL for this server with explicit credentials, for tests of wrong or missing ones.
    /// Both parts are percent-encoded; with a password the URL says `allow_insecure_auth=true`
    /// (the server listens on loopback only).
    pub fn url_with(&self, user: Option<&str>, password: Option<&str>) -> String {
        let userinfo = match (user, password) {
            (None, None) => String::new(),
            (user, None) => format!("{}@", percent_encode(user.unwrap_or_default())),
            (user, Some(pass)) => format!(
                "{}:{}@",
                percent_encode(user.unwrap_or_default()),
                percent_encode(pass)
            ),
        };
        let query = if password.is_some() {
            "?allow_insecure_auth=true"
        } else {
            ""
        };
        format!("redis://{userinfo}127.0.0.1:{}{query}", self.port)
    }

    /// Starts `n` independent servers, the nodes of a Redlock (see [`redlock_url`](Self::redlock_url)).
    ///
    /// # Errors
    ///
    /// Fails if a server does not start.
    pub fn start_independent(n: usize) -> io::Result<Vec<RedisServer>> {
        (0..n).map(|_| RedisServer::start()).collect()
    }

    /// `redlock://127.0.0.1:p1,127.0.0.1:p2,…` over `nodes`.
    pub fn redlock_url(nodes: &[RedisServer]) -> String {
        let hosts: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }

    /// The options the server was started with.
    pub fn options(&self) -> &RedisServerOptions {
        &self.options
    }

    /// The process id, or `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is alive (it may still be paused by [`pause`](Self::pause)).
    pub fn is_running(&mut self) -> bool {
        process::is_running(&mut self.child)
    }

    /// Kills the server with `SIGKILL` and waits for it to exit, as in a crash: clients see their
    /// connections close and new connections are refused. Does nothing if it is not running.
    pub fn kill(&mut self) {
        process::kill(&mut self.child);
    }

    /// Starts the server again on the same port with empty data and waits until it is up,
    /// killing the running process first if there is one.
    ///
    /// # Errors
    ///
    /// Fails if the server does not come back, for instance because another process took the
    /// port while it was down.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.launch().map_err(|e| match e {
            LaunchError::PortTaken(e) => io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "cannot restart redis-server: port {} was taken while it was down: {e}",
                    self.port
                ),
            ),
            LaunchError::Failed(e) => e,
        })
    }

    /// Stops the process with `SIGSTOP`: connections stay open but nothing is answered, like a
    /// server stuck in a long pause. [`resume`](Self::resume) continues it.
    ///
    /// # Errors
    ///
    /// Fails if the server is not running.
    pub fn pause(&self) -> io::Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// Continues a server stopped by [`pause`](Self::pause) (`SIGCONT`).
    ///
    /// # Errors
    ///
    /// Fails if the server is not running.
    pub fn resume(&self) -> io::Result<()> {
        self.signal(libc::SIGCONT)
    }

    fn signal(&self, signal: libc::c_int) -> io::Result<()> {
        process::signal(self.child.as_ref(), BINARY, signal)
    }

    /// Sends one command over a fresh connection (the `redis` crate's, no `redis-cli` needed)
    /// and returns the reply as text. Authenticates first when the server has a password or an ACL
    /// user.
    ///
    /// Rendering: simple strings, integers and bulk strings as their text (`"OK"`, `"1"`,
    /// `"value"`), a nil reply as `"(nil)"`, arrays as their rendered elements joined by `\n`
    /// (`""` when empty), errors inside arrays as `"(error) ERR ..."`.
    ///
    /// ```no_run
    /// # let server = distlock_testkit::redis::RedisServer::start()?;
    /// server.cli(&["DEL", "some-lock"])?;
    /// server.cli(&["CLIENT", "KILL", "TYPE", "normal"])?; // drops every client but this one
    /// server.cli(&["DEBUG", "SLEEP", "2"])?; // blocks the server for two seconds
    /// server.cli(&["FLUSHALL"])?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// An error reply becomes an [`io::Error`] whose message is the server's text (for example
    /// `ERR unknown command ...`); connection failures and timeouts (60 s) are returned as they
    /// are. `args` must not be empty.
    pub fn cli(&self, args: &[&str]) -> io::Result<String> {
        let Some((command, rest)) = args.split_first() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cli needs a command",
            ));
        };
        // No `CLIENT SETINFO` on connect: the one command asked for is all the server sees.
        let mut login = ::redis::RedisConnectionInfo::default().set_skip_set_lib_name();
        match (&self.options.acl_user, &self.options.password) {
            (Some((user, pass)), _) => login = login.set_username(user).set_password(pass),
            (None, Some(pass)) => login = login.set_password(pass),
            (None, None) => {}
        }
        let info = ::redis::ConnectionAddr::Tcp("127.0.0.1".to_owned(), self.port)
            .into_connection_info()
            .map_err(cli_error)?
            .set_redis_settings(login);
        let client = ::redis::Client::open(info).map_err(cli_error)?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .map_err(cli_error)?;
        connection
            .set_read_timeout(Some(CLI_TIMEOUT))
            .map_err(cli_error)?;
        connection
            .set_write_timeout(Some(CLI_TIMEOUT))
            .map_err(cli_error)?;
        match connection
            .req_command(::redis::cmd(command).arg(rest))
            .map_err(cli_error)?
        {
            Value::ServerError(e) => Err(io::Error::other(server_error(&e))),
            reply => Ok(render(&reply)),
        }
    }

    /// Spawns the process on `self.port` with an empty data directory and waits until it is up.
    fn launch(&mut self) -> Result<(), LaunchError> {
        let failed = LaunchError::Failed;
        let data = self.data_dir();
        match std::fs::remove_dir_all(&data) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed(e)),
        }
        std::fs::create_dir_all(&data).map_err(failed)?;

        let log_path = self.log_path();
        let log = process::open_log(&log_path).map_err(failed)?;
        let log_start = log.start;

        let mut command = Command::new(&self.binary);
        if let Some(master) = self.options.sentinel_of {
            // A Sentinel rewrites its configuration file, so it gets one of its own.
            let conf = self.dir.path().join("sentinel.conf");
            let conf_text = sentinel::config(
                master,
                self.options.master_password.as_deref(),
                self.options.password.as_deref(),
            );
            std::fs::write(&conf, conf_text).map_err(failed)?;
            command.arg(&conf).arg("--sentinel");
        }
        if self.options.cluster {
            command
                .args(["--cluster-enabled", "yes"])
                .arg("--cluster-config-file")
                .arg(self.dir.path().join("nodes.conf"))
                .arg("--cluster-node-timeout")
                .arg(cluster::NODE_TIMEOUT.as_millis().to_string());
        }
        if let Some(master) = self.options.replica_of {
            command
                .args(["--replicaof", "127.0.0.1"])
                .arg(master.to_string());
        }
        if self.options.sentinel_of.is_none() {
            // A replica's full sync starts at once instead of after 5 s spent waiting for
            // more replicas to share it: a Sentinel set or a cluster forms, a node rejoins,
            // and a failover's new master serves its replicas that much sooner.
            command.args(["--repl-diskless-sync-delay", "0"]);
        }
        command
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&data);
        if major_version(&self.binary).map_err(failed)? >= 7 {
            // Redis 7 refuses DEBUG (used by fault tests: DEBUG SLEEP) unless enabled.
            command.args(["--enable-debug-command", "local"]);
        }
        if let Some(pass) = &self.options.password {
            command.arg("--requirepass").arg(pass);
        }
        let masterauth = self
            .options
            .master_password
            .as_ref()
            .or(self.options.password.as_ref());
        if let (Some(pass), None) = (masterauth, self.options.sentinel_of) {
            command.arg("--masterauth").arg(pass);
        }
        if let (Some(dir), Some(tls_port)) = (&self.options.tls, self.tls_port) {
            command
                .arg("--tls-port")
                .arg(tls_port.to_string())
                .arg("--tls-cert-file")
                .arg(dir.join("server.crt"))
                .arg("--tls-key-file")
                .arg(dir.join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(dir.join("ca.crt"))
                .args(["--tls-auth-clients", "no"])
                .args(["--tls-replication", "yes"]);
            if self.options.cluster {
                command.args(["--tls-cluster", "yes"]);
            }
        }
        if let Some((user, pass)) = &self.options.acl_user {
            command
                .arg("--user")
                .arg(user)
                .arg("on")
                .arg(format!(">{pass}"))
                .args(["~*", "&*", "+@all"]);
        }
        command
            .stdin(Stdio::null())
            .stdout(log.stdout)
            .stderr(log.stderr);
        let child = spawn_tied_to_process(command)
            .map_err(|e| failed(spawn_error(&self.binary, BINARY, e)))?;
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = process::exit_status(&mut self.child) {
                let log = read_log(&log_path, log_start);
                let error = io::Error::other(format!(
                    "redis-server on port {} exited during start-up ({status}); its output:\n{log}",
                    self.port
                ));
                return Err(if log.contains("Address already in use") {
                    LaunchError::PortTaken(error)
                } else {
                    LaunchError::Failed(error)
                });
            }
            if answers_ping(self.addr()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                let log = read_log(&log_path, log_start);
                return Err(failed(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-server on port {} did not answer PING within {START_TIMEOUT:?}; \
                         its output:\n{log}",
                        self.port
                    ),
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }
}

impl Drop for RedisServer {
    /// Kills the process (`SIGKILL`), waits for it and removes its directory.
    fn drop(&mut self) {
        self.kill();
    }
}

/// The major version of the server binary (`7` for `v=7.0.15`), or 0 if it cannot be read.
fn major_version(binary: &str) -> io::Result<u32> {
    static DEFAULT: OnceLock<u32> = OnceLock::new();
    if binary == BINARY {
        if let Some(version) = DEFAULT.get() {
            return Ok(*version);
        }
    }
    let output = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| spawn_error(binary, BINARY, e))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .and_then(|v| v.split('.').next())
        .and_then(|major| major.parse().ok())
        .unwrap_or(0);
    if binary == BINARY {
        let _ = DEFAULT.set(version);
    }
    Ok(version)
}

/// A failure of [`RedisServer::cli`] as an [`io::Error`]: a refused login is `PermissionDenied`,
/// a connection failure keeps its kind, an error reply is the server's text.
fn cli_error(e: ::redis::RedisError) -> io::Error {
    if e.kind() == ::redis::ErrorKind::AuthenticationFailed {
        return io::Error::new(io::ErrorKind::PermissionDenied, format!("AUTH failed: {e}"));
    }
    if let Some(code) = e.code() {
        let text = match e.detail() {
            Some(detail) => format!("{code} {detail}"),
            None => code.to_owned(),
        };
        return io::Error::other(text);
    }
    let kind = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<io::Error>())
        .map_or(io::ErrorKind::Other, io::Error::kind);
    io::Error::new(kind, e.to_string())
}

/// An error reply as the server sent it: `ERR unknown command ...`.
fn server_error(e: &::redis::ServerError) -> String {
    match e.details() {
        Some(detail) => format!("{} {detail}", e.code()),
        None => e.code().to_owned(),
    }
}

/// A reply as text: scalars as their text, nil as `(nil)`, the elements of arrays, sets and
/// maps (keys and values in turn) on lines of their own, errors inside them as `(error) ...`.
fn render(reply: &Value) -> String {
    let lines = |items: &[Value]| items.iter().map(render).collect::<Vec<_>>().join("\n");
    match reply {
        Value::Nil => "(nil)".to_owned(),
        Value::Okay => "OK".to_owned(),
        Value::Int(n) => n.to_string(),
        Value::Double(x) => x.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => text.clone(),
        Value::BulkString(data) => String::from_utf8_lossy(data).into_owned(),
        Value::Array(items) | Value::Set(items) | Value::Push { data: items, .. } => lines(items),
        Value::Map(pairs) => lines(
            &pairs
                .iter()
                .flat_map(|(k, v)| [k.clone(), v.clone()])
                .collect::<Vec<_>>(),
        ),
        Value::Attribute { data, .. } => render(data),
        Value::ServerError(e) => format!("(error) {}", server_error(e)),
        other => format!("{other:?}"),
    }
}

/// Whether something at `addr` answers a raw `PING` the way a running Redis does.
fn answers_ping(addr: SocketAddr) -> bool {
    let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let timeout = Some(Duration::from_millis(500));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    if (&stream).write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    if BufReader::new(stream).read_line(&mut line).is_err() {
        return false;
    }
    // `-NOAUTH` means a password is required: the server is up and serving.
    line.starts_with("+PONG") || line.starts_with("-NOAUTH")
}

/// Percent-encodes everything but RFC 3986 unreserved characters, for URL user info.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
