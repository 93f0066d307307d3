//! Helpers shared by the PostgreSQL and MariaDB test servers: service users, blocking on async
//! client calls from test code, database names and leftover clean-up.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::free_port;

/// The uid and gid of a system user, such as `postgres`, when it exists.
pub(crate) fn service_user(name: &str) -> Option<(u32, u32)> {
    let cname = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam returns a pointer to static storage or NULL; we copy two integers out
    // at once. Tests that call this may race on that storage only with other getpwnam callers,
    // which the testkit serialises through its callers' start-up.
    unsafe {
        let pw = libc::getpwnam(cname.as_ptr());
        if pw.is_null() {
            None
        } else {
            Some(((*pw).pw_uid, (*pw).pw_gid))
        }
    }
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Hands `path` and everything under it to `uid:gid`.
pub(crate) fn chown_tree(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Runs an async client call to completion from synchronous test code, also from inside a
/// Tokio runtime (on a thread of its own with its own runtime).
pub(crate) fn block_on<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> io::Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|rt| rt.block_on(fut))
    })
    .join()
    .map_err(|_| io::Error::other("the database helper thread panicked"))?
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A database name unique to this process and moment: `distlock_t<secs>_<pid>_<random>`.
pub(crate) fn unique_database_name() -> String {
    format!(
        "distlock_t{}_{}_{:06x}",
        now_secs(),
        std::process::id(),
        rand::random::<u32>() & 0xff_ffff
    )
}

/// Whether a database made by [`unique_database_name`] is a leftover: its process is gone and
/// it is older than ten minutes.
pub(crate) fn is_stale_database(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("distlock_t") else {
        return false;
    };
    let mut parts = rest.split('_');
    let (Some(secs), Some(pid)) = (parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(secs), Ok(pid)) = (secs.parse::<u64>(), pid.parse::<u32>()) else {
        return false;
    };
    now_secs().saturating_sub(secs) > 600 && !Path::new(&format!("/proc/{pid}")).exists()
}

/// The first of `names` found on `PATH` or in `extra` directories.
pub(crate) fn find_binary(names: &[&str], extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = extra
        .iter()
        .cloned()
        .chain(std::env::split_paths(&path))
        .collect();
    for name in names {
        for dir in &dirs {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// Reads a server log for an error message (at most the last 4 KiB).
pub(crate) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(4096);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}

/// Rows of a query, every value as text (`None` for NULL).
pub(crate) type Rows = Vec<Vec<Option<String>>>;

/// What a [`TestDatabase`] needs of its server.
pub trait DatabaseServer: Send + Sync + 'static {
    /// The URL that connects to `database`.
    fn database_url(&self, database: &str) -> String;
    /// Runs `sql` in `database`.
    fn query_in(&self, database: &str, sql: &str) -> io::Result<Rows>;
    /// The names of the server's databases that start with `distlock_t`.
    fn test_databases(&self) -> io::Result<Vec<String>>;
    /// Creates the empty database `name`.
    fn create_database(&self, name: &str) -> io::Result<()>;
    /// Drops the database `name` (with its connections, where the server can), ignoring errors.
    fn drop_database(&self, name: &str);
}

/// An empty database on a test server, dropped with this handle.
pub struct TestDatabase<S: DatabaseServer> {
    server: Arc<S>,
    name: String,
    url: String,
}

impl<S: DatabaseServer> fmt::Debug for TestDatabase<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDatabase")
            .field("name", &self.name)
            .finish()
    }
}

impl<S: DatabaseServer> TestDatabase<S> {
    /// The URL that connects to this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server it lives on.
    pub fn server(&self) -> &Arc<S> {
        &self.server
    }

    /// Runs `sql` in this database (see the server's `query`).
    pub fn query(&self, sql: &str) -> io::Result<Rows> {
        self.server.query_in(&self.name, sql)
    }
}

impl<S: DatabaseServer> Drop for TestDatabase<S> {
    fn drop(&mut self) {
        self.server.drop_database(&self.name);
    }
}

/// Creates an empty database for one test on `server`, dropping the leftovers of crashed test
/// processes on the way.
pub(crate) fn fresh_database<S: DatabaseServer>(server: &Arc<S>) -> io::Result<TestDatabase<S>> {
    if let Ok(names) = server.test_databases() {
        for name in names.iter().filter(|n| is_stale_database(n)) {
            server.drop_database(name);
        }
    }
    let name = unique_database_name();
    server.create_database(&name)?;
    Ok(TestDatabase {
        url: server.database_url(&name),
        name,
        server: server.clone(),
    })
}

/// The throwaway server behind `owned`, locked; `None` (the machine's server) panics, since
/// tests must never `verb` (stop, restart) it.
pub(crate) fn lock_owned<'a, O>(
    owned: Option<&'a Mutex<O>>,
    what: &str,
    verb: &str,
) -> MutexGuard<'a, O> {
    let Some(owned) = owned else {
        panic!("refusing to {verb} the machine's {what} server");
    };
    owned.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls `launch` with free ports until it starts, or fails for a reason other than another
/// process taking the port first (`AddrInUse`); `what` names the server in the last error.
pub(crate) fn launch_on_free_port(
    what: &str,
    mut launch: impl FnMut(u16) -> io::Result<()>,
) -> io::Result<()> {
    let mut last = None;
    for _ in 0..5 {
        match launch(free_port()) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other(format!("{what} did not start"))))
}

/// The machine's own server, unless `DISTLOCK_TEST_THROWAWAY=1`: the admin URL from `env`
/// (else `default`), when something listens at its address. Returns the address, the parsed
/// URL and its base (scheme, user info, host and port: no path, no query).
pub(crate) fn machine_admin(
    env: &str,
    default: &str,
    default_port: u16,
) -> Option<(SocketAddr, url::Url, String)> {
    if std::env::var_os("DISTLOCK_TEST_THROWAWAY").is_some_and(|v| v == "1") {
        return None;
    }
    let admin = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    let parsed = url::Url::parse(&admin).ok()?;
    let addr: SocketAddr = format!(
        "{}:{}",
        parsed.host_str()?,
        parsed.port().unwrap_or(default_port)
    )
    .parse()
    .ok()?;
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    let mut base = parsed.clone();
    base.set_path("");
    base.set_query(None);
    let base = base.to_string().trim_end_matches('/').to_owned();
    Some((addr, parsed, base))
}

/// `server` when it answers `ping` (something listens at `addr`: a busy server gets a few
/// chances), else `None`, after saying that a throwaway `what` server starts instead.
pub(crate) fn if_answers<S>(
    server: S,
    what: &str,
    addr: SocketAddr,
    ping: impl Fn(&S) -> io::Result<Rows>,
) -> Option<S> {
    for attempt in 0..3 {
        match ping(&server) {
            Ok(_) => return Some(server),
            Err(e) if attempt == 2 => {
                eprintln!(
                    "distlock testkit: {what} at {addr} does not answer ({e}); \
                     starting a throwaway server"
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
    None
}

/// The uid and gid to run a throwaway server as: `user`'s when the tests run as root (servers
/// refuse to run as root), none otherwise; `package` creates the user.
pub(crate) fn server_ids(user: &str, what: &str, package: &str) -> io::Result<Option<(u32, u32)>> {
    if !is_root() {
        return Ok(None);
    }
    service_user(user).map(Some).ok_or_else(|| {
        io::Error::other(format!(
            "tests run as root, but there is no '{user}' user to run a throwaway {what} server \
             as (apt-get install {package} creates it)"
        ))
    })
}

/// Runs a set-up command (`initdb`, `mariadb-install-db`) to its end; a failure is an error
/// with its output.
pub(crate) fn run_setup(mut cmd: std::process::Command, name: &str) -> io::Result<()> {
    let out = cmd
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run {name}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{name} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}

/// How long a throwaway server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What a throwaway server writes to its log as it starts.
pub(crate) struct StartUp<'a> {
    /// The server binary, for messages.
    pub(crate) what: &'a str,
    /// Its log, and where this start's output begins in it.
    pub(crate) log_path: &'a Path,
    pub(crate) log_start: u64,
    /// Written once it accepts connections.
    pub(crate) ready: &'a str,
    /// Any of these means another process has its port.
    pub(crate) port_taken: &'a [&'a str],
}

/// Spawns the server `cmd` (as `ids` when set), tied to this process, into `child`, and waits
/// as [`wait_until_ready`] does. On an error the caller kills what `child` holds.
pub(crate) fn spawn_until_ready(
    mut cmd: std::process::Command,
    ids: Option<(u32, u32)>,
    child: &mut Option<Child>,
    port: u16,
    start: &StartUp,
) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = ids {
        cmd.uid(uid).gid(gid);
    }
    let program = Path::new(cmd.get_program()).display().to_string();
    let spawned = crate::spawn_tied_to_process(cmd)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start {program}: {e}")))?;
    *child = Some(spawned);
    wait_until_ready(child, port, start)
}

/// Waits until the server just spawned as `child` logs that it is ready and accepts
/// connections on `port`. One that exits is an error (`AddrInUse` when its port was taken, worth
/// another port); one that is not ready within 30 seconds too, and the caller kills it.
pub(crate) fn wait_until_ready(
    child: &mut Option<Child>,
    port: u16,
    start: &StartUp<'_>,
) -> io::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let fresh_log = || {
        let bytes = std::fs::read(start.log_path).unwrap_or_default();
        let from = usize::try_from(start.log_start).map_or(0, |s| s.min(bytes.len()));
        String::from_utf8_lossy(&bytes[from..]).into_owned()
    };
    loop {
        if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
            *child = None;
            let log = fresh_log();
            let kind = if start.port_taken.iter().any(|p| log.contains(p)) {
                io::ErrorKind::AddrInUse
            } else {
                io::ErrorKind::Other
            };
            let from = (log.len().saturating_sub(4096)..log.len())
                .find(|i| log.is_char_boundary(*i))
                .unwrap_or(log.len());
            let tail = &log[from..];
            return Err(io::Error::new(
                kind,
                format!("{} exited during start-up ({status}): {tail}", start.what),
            ));
        }
        if fresh_log().contains(start.ready)
            && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!(
                "{} did not come up within {START_TIMEOUT:?}: {}",
                start.what,
                log_tail(start.log_path)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What both database servers' modules take from the testkit, in one import.
pub(crate) mod kit {
    pub(crate) use super::{
        block_on, chown_tree, find_binary, if_answers, launch_on_free_port, machine_admin,
        run_setup, server_ids, spawn_until_ready, DatabaseServer, Rows, StartUp,
    };
    pub(crate) use crate::{process, remove_leftover_dirs, TempDir};
}
