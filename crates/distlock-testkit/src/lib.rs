//! distlock's test infrastructure (not published): throwaway servers on free loopback ports, a
//! fault-injecting TCP proxy, and the shared behaviour suite every backend passes.
//!
//! Nothing here is meant for production use: the server helpers block the calling thread while a
//! server starts, and they assume a Unix machine with the server binaries installed
//! (`scripts/test.sh` installs them). A missing binary is an error that says what to install,
//! never a silent skip.
//!
//! - [`redis::RedisServer`] runs a private `redis-server` that can be killed and restarted on the
//!   same port mid-test; [`postgres`], [`mysql`], [`zookeeper`] and [`etcd`] do the same for
//!   their servers.
//! - [`proxy::FaultProxy`] sits between a client and a server and cuts, delays or pauses the
//!   traffic on demand.
//! - [`free_port`] finds a loopback port nobody listens on.
//! - [`tls::TestCa`] makes a private CA with server and client certificates for TLS tests.
//! - [`timing::scheduling_slack`] sizes a test's time limit by how late this machine runs now.
//! - [`conformance`] is the behaviour suite, and [`conformance_suite!`] runs it on a backend.
//!
//! distlock's own unit tests use this crate too (a dev-dependency cycle Cargo allows): there the
//! library is compiled twice, so only plain values (URLs, strings) cross between the two.
#![warn(missing_docs, unreachable_pub, rustdoc::broken_intra_doc_links)]

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// The process controls of the testkit's servers that are sets of members (etcd, ZooKeeper):
/// `self.members()` locks the set, whose `members[i]` says whether it runs and can be killed,
/// and which restarts member `i`. `single` is for a one-member server, `cluster` for member `i`
/// of several.
macro_rules! member_controls {
    (single) => {
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
        pub fn restart(&self) -> std::io::Result<()> {
            self.members().restart(0)
        }
    };
    (cluster) => {
        /// Whether member `i`'s process is alive.
        pub fn is_running(&self, i: usize) -> bool {
            self.members().members[i].is_running()
        }

        /// Kills member `i` with `SIGKILL`.
        pub fn kill(&self, i: usize) {
            self.members().members[i].kill();
        }

        /// Starts member `i` again with its ports and data and waits until it serves (which
        /// needs a quorum of running members).
        ///
        /// # Errors
        /// When it does not come back.
        pub fn restart(&self, i: usize) -> std::io::Result<()> {
            self.members().restart(i)
        }
    };
}

/// What the testkit's PostgreSQL and MariaDB servers share, for a type `$server` whose `mode`
/// is `Mode::Machine { base, .. }` (the machine's server) or `Mode::Owned(Mutex<Owned>)` (a
/// throwaway one, whose `Owned` has a `port` and can `kill` and `launch` it): sharing one
/// server per test process, `Debug`, fresh databases, and stopping and restarting throwaway
/// servers. `$what` names the server in messages, `$package` is the one to install.
macro_rules! database_server_controls {
    ($server:ident, $what:literal, $package:literal) => {
        impl fmt::Debug for $server {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut d = f.debug_struct(stringify!($server));
                match &self.mode {
                    Mode::Machine { base, .. } => d.field("machine", &distlock::redact(base)),
                    Mode::Owned(o) => {
                        let port = o.lock().unwrap_or_else(|e| e.into_inner()).port;
                        d.field("throwaway_port", &port)
                    }
                }
                .finish()
            }
        }

        impl $server {
            /// The machine's running server if one answers (see the module docs), else
            /// a throwaway server shared by the whole test process.
            ///
            /// # Errors
            /// When no server answers and none can be started (binaries missing: the message
            #[doc = concat!("says to install `", $package, "`).")]
            pub fn machine_or_start() -> io::Result<Arc<$server>> {
                static SHARED: OnceLock<Mutex<Option<Arc<$server>>>> = OnceLock::new();
                super::shared(&SHARED, || Self::machine().map_or_else(Self::start, Ok))
            }

            /// Whether this is a throwaway server of this process (which may be stopped and
            /// restarted), rather than the machine's.
            pub fn is_throwaway(&self) -> bool {
                matches!(self.mode, Mode::Owned(_))
            }

            /// Creates an empty database for one test; it is dropped (with its connections)
            /// when the returned handle is. Leftovers of crashed test processes are dropped on
            /// the way.
            pub fn fresh_database(self: &Arc<Self>) -> io::Result<TestDatabase> {
                super::db::fresh_database(self)
            }

            /// Stops a throwaway server at once (`SIGKILL`; PostgreSQL's backends follow their
            /// postmaster): a crash as clients see it. The data stays;
            /// [`start_again`](Self::start_again) brings it back on the same port.
            ///
            /// # Panics
            /// On the machine's server, which tests must never stop.
            pub fn stop(&self) {
                super::db::lock_owned(self.owned(), $what, "stop").kill();
            }

            /// Starts a stopped throwaway server again on its port, with its data, and waits
            /// until it accepts connections.
            ///
            /// # Panics
            /// On the machine's server.
            pub fn start_again(&self) -> io::Result<()> {
                let mut o = super::db::lock_owned(self.owned(), $what, "restart");
                o.kill();
                o.launch()
            }

            fn owned(&self) -> Option<&Mutex<Owned>> {
                match &self.mode {
                    Mode::Owned(o) => Some(o),
                    Mode::Machine { .. } => None,
                }
            }
        }
    };
}

pub mod conformance;
mod db;
pub mod etcd;
pub mod holds;
pub mod hooked;
pub mod mysql;
pub mod postgres;
pub(crate) mod process;
pub mod proxy;
pub mod redis;
pub mod timing;
pub mod tls;
pub mod zookeeper;

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// The port is found by binding `127.0.0.1:0`, reading the port the kernel chose and closing the
/// socket again, so another process may take it before the caller does; servers started by the
/// testkit retry with a fresh port when that happens.
///
/// # Panics
///
/// Panics if the loopback interface cannot be bound at all, which no test can recover from.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("cannot bind 127.0.0.1:0 to find a free port");
    listener
        .local_addr()
        .expect("a bound listener has a local address")
        .port()
}

/// Spawns a server process that dies with the test process, however that ends.
///
/// `Drop` kills servers when tests end normally, but not when the test process is killed (a
/// timeout in the test runner, `abort`, Ctrl-C) or when a server sits in a `static` (statics are
/// never dropped). On Linux the child therefore asks the kernel for `SIGKILL` when its parent
/// dies (`PR_SET_PDEATHSIG`). The kernel means the parent *thread*, and test threads end with
/// their test while a shared server may live on, so every spawn happens on one helper thread
/// that lives as long as the process.
pub(crate) fn spawn_tied_to_process(command: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();

    let spawner = SPAWNER.get_or_init(|| {
        let (requests, inbox) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("distlock-testkit-spawner".to_owned())
            .spawn(move || {
                for (mut command, reply) in inbox {
                    let _ = reply.send(spawn_with_parent_death_signal(&mut command));
                }
            })
            .expect("cannot start the testkit spawner thread");
        requests
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .send((command, reply))
        .map_err(|_| io::Error::other("the testkit spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the testkit spawner thread is gone"))?
}

#[cfg(target_os = "linux")]
fn spawn_with_parent_death_signal(command: &mut Command) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;

    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only prctl and
    // getppid, which are async-signal-safe; it only reads a copied integer.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then we were adopted, and must go.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::other("test process exited during spawn"));
            }
            Ok(())
        });
    }
    command.spawn()
}

#[cfg(not(target_os = "linux"))]
fn spawn_with_parent_death_signal(command: &mut Command) -> io::Result<Child> {
    command.spawn()
}

/// One server per test process, made by `start` on first use and kept in `slot` (a `static` of
/// the caller). A start that fails is not remembered: the next caller tries again.
pub(crate) fn shared<T>(
    slot: &'static OnceLock<Mutex<Option<Arc<T>>>>,
    start: impl FnOnce() -> io::Result<T>,
) -> io::Result<Arc<T>> {
    let mut slot = slot
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(s) = slot.as_ref() {
        return Ok(s.clone());
    }
    let s = Arc::new(start()?);
    *slot = Some(s.clone());
    Ok(s)
}

/// Removes directories `<prefix>-<pid>-…` (in the temp dir and in `/dev/shm`) whose process is
/// gone. Servers kept in a `static` die with their test process (see [`spawn_tied_to_process`])
/// but their directory is never dropped; without this sweep every test process would leave one
/// behind, and data directories in `/dev/shm` are memory.
pub(crate) fn remove_leftover_dirs(prefix: &str) {
    for root in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
                continue;
            };
            // `<prefix>-cluster-<pid>` belongs to another prefix; only digits are a pid.
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// A directory under the system temp dir that is removed, with its contents, on drop.
///
/// The testkit needs only this of the `tempfile` crate.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a fresh, empty directory whose name starts with `prefix`.
    pub(crate) fn new(prefix: &str) -> std::io::Result<TempDir> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("{prefix}-{}-{nanos:09}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir { path })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory in /tmp must not fail a test.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_can_be_bound_again() {
        let port = free_port();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("the free port is bindable");
    }

    #[test]
    fn temp_dir_is_removed_on_drop() {
        let dir = TempDir::new("distlock-testkit-selftest").unwrap();
        let path = dir.path().to_owned();
        std::fs::write(path.join("file"), b"x").unwrap();
        assert!(path.is_dir());
        drop(dir);
        assert!(!path.exists());
    }
}
