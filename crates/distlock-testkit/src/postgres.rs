//! PostgreSQL for tests: a fresh database per test on the machine's running server, or a
//! throwaway server of the test's own.
//!
//! [`PostgresServer::machine_or_start`] looks for a server at `127.0.0.1:5432` (user
//! `postgres`, or the admin URL in `DISTLOCK_TEST_POSTGRES_URL`) and otherwise starts a
//! throwaway one for the test process; `DISTLOCK_TEST_THROWAWAY=1` always starts one.
//! [`PostgresServer::start`] always starts a throwaway server: the only kind a test may stop
//! and restart. A throwaway server runs `initdb` and `postgres` from the installed PostgreSQL
//! (as the `postgres` user when the tests run as root) in a temporary directory, on a free
//! loopback port, with password authentication over TCP and durability switched off.
//! Missing binaries are an error that says what to install, never a skip.
//!
//! ```no_run
//! use distlock_testkit::postgres::PostgresServer;
//! let server = PostgresServer::machine_or_start()?;
//! let db = server.fresh_database()?; // dropped again with `db`
//! println!("{}", db.url());
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::db::kit::*;

const DIR_PREFIX: &str = "distlock-testkit-pg";

/// A PostgreSQL server for tests: the machine's own, or a throwaway one.
pub struct PostgresServer {
    mode: Mode,
}

enum Mode {
    /// A server this process did not start: only databases are created and dropped on it.
    Machine {
        base: String,
        admin_db: String,
    },
    Owned(Mutex<Owned>),
}

struct Owned {
    bin: PathBuf,
    dir: TempDir,
    port: u16,
    password: String,
    ids: Option<(u32, u32)>,
    child: Option<Child>,
}

database_server_controls!(PostgresServer, "PostgreSQL", "postgresql");

impl PostgresServer {
    fn machine() -> Option<PostgresServer> {
        let (addr, parsed, base) = machine_admin(
            "DISTLOCK_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
            5432,
        )?;
        let admin_db = parsed.path().trim_start_matches('/').to_owned();
        let server = PostgresServer {
            mode: Mode::Machine {
                base,
                admin_db: if admin_db.is_empty() {
                    "postgres".to_owned()
                } else {
                    admin_db
                },
            },
        };
        if_answers(server, "PostgreSQL", addr, |s| s.admin_query("SELECT 1"))
    }

    /// Starts a throwaway server of this test's own: `initdb` into a temporary directory, then
    /// `postgres` on a free loopback port. Dropping it kills the server and removes the
    /// directory.
    ///
    /// # Errors
    /// When the PostgreSQL server binaries are missing (`apt-get install postgresql`), or the
    /// server does not come up within 30 seconds (the message includes its log).
    pub fn start() -> io::Result<PostgresServer> {
        remove_leftover_dirs(DIR_PREFIX);
        let bin = bin_dir()?;
        let dir = TempDir::new(DIR_PREFIX)?;
        let ids = server_ids("postgres", "PostgreSQL", "postgresql")?;
        let password = format!("pw{:016x}", rand::random::<u64>());
        std::fs::write(dir.path().join("pwfile"), &password)?;
        if let Some((uid, gid)) = ids {
            chown_tree(dir.path(), uid, gid)?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(dir.path().join("data"))
            .args([
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .arg(format!("--pwfile={}", dir.path().join("pwfile").display()))
            .stdin(Stdio::null());
        if let Some((uid, gid)) = ids {
            initdb.uid(uid).gid(gid);
        }
        run_setup(initdb, &bin.join("initdb").display().to_string())?;
        let mut owned = Owned {
            bin,
            dir,
            port: 0,
            password,
            ids,
            child: None,
        };
        launch_on_free_port("postgres", |port| {
            owned.port = port;
            owned.launch()
        })?;
        Ok(PostgresServer {
            mode: Mode::Owned(Mutex::new(owned)),
        })
    }

    /// `postgres://user[:password]@127.0.0.1:port/<database>`.
    pub fn url(&self, database: &str) -> String {
        match &self.mode {
            Mode::Machine { base, .. } => format!("{base}/{database}"),
            Mode::Owned(o) => {
                let o = o.lock().unwrap_or_else(|e| e.into_inner());
                format!(
                    "postgres://postgres:{}@127.0.0.1:{}/{database}",
                    o.password, o.port
                )
            }
        }
    }

    /// The same server with an explicit password, for tests of wrong ones (throwaway servers
    /// check passwords; the machine's may trust every loopback client).
    pub fn url_with_password(&self, database: &str, password: &str) -> String {
        let mut u = url::Url::parse(&self.url(database)).expect("a valid URL");
        let _ = u.set_password(Some(password));
        u.to_string()
    }

    fn admin_db(&self) -> String {
        match &self.mode {
            Mode::Machine { admin_db, .. } => admin_db.clone(),
            Mode::Owned(_) => "postgres".to_owned(),
        }
    }

    fn admin_query(&self, sql: &str) -> io::Result<Vec<Vec<Option<String>>>> {
        self.query(&self.admin_db(), sql)
    }

    /// Runs `sql` (simple query protocol, several statements allowed) in `database` and returns
    /// the rows of every statement as text.
    pub fn query(&self, database: &str, sql: &str) -> io::Result<Vec<Vec<Option<String>>>> {
        let url = self.url(database);
        let sql = sql.to_owned();
        block_on(async move {
            let (client, connection) = tokio::time::timeout(
                Duration::from_secs(10),
                tokio_postgres::connect(&url, tokio_postgres::NoTls),
            )
            .await
            .map_err(|_| io::Error::other("postgres: no connection within 10 s"))?
            .map_err(|e| io::Error::other(format!("postgres: {e}")))?;
            let driver = tokio::spawn(connection);
            let messages = client.simple_query(&sql).await.map_err(|e| {
                let text = e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned());
                io::Error::other(format!("postgres: {sql}: {text}"))
            })?;
            drop(client);
            let _ = driver.await;
            let mut rows = Vec::new();
            for m in messages {
                if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                    rows.push((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect());
                }
            }
            Ok(rows)
        })?
    }
}

impl DatabaseServer for PostgresServer {
    fn database_url(&self, database: &str) -> String {
        self.url(database)
    }

    fn query_in(&self, database: &str, sql: &str) -> io::Result<Rows> {
        self.query(database, sql)
    }

    fn test_databases(&self) -> io::Result<Vec<String>> {
        let rows =
            self.admin_query("SELECT datname FROM pg_database WHERE datname LIKE 'distlock\\_t%'")?;
        Ok(rows
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
            .collect())
    }

    fn create_database(&self, name: &str) -> io::Result<()> {
        self.admin_query(&format!("CREATE DATABASE \"{name}\""))
            .map(drop)
    }

    fn drop_database(&self, name: &str) {
        let _ = self.admin_query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"));
    }
}

impl Owned {
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            // The backends notice the postmaster's death within a moment; a new postmaster
            // refuses to start while they still hold the shared memory.
            let deadline = Instant::now() + Duration::from_secs(10);
            let pid_file = self.dir.path().join("data/postmaster.pid");
            while Instant::now() < deadline {
                if !backends_alive(&pid_file) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn launch(&mut self) -> io::Result<()> {
        let log_path = self.dir.path().join("postgres.log");
        let log = process::open_log(&log_path)?;
        // fsync=off keeps the server fast and still survives the kill of a process (the WAL is
        // in the OS's page cache); synchronous_commit stays on, so that a commit the client saw
        // is never lost by `kill` + `start_again`, as it would be while still in WAL buffers.
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .args([
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=32MB",
            ])
            .stdin(Stdio::null())
            .stdout(log.stdout)
            .stderr(log.stderr);
        let start = StartUp {
            what: "postgres",
            log_path: &log_path,
            log_start: log.start,
            ready: "ready to accept connections",
            port_taken: &["could not bind", "already in use"],
        };
        let started = spawn_until_ready(cmd, self.ids, &mut self.child, self.port, &start);
        if started.is_err() {
            self.kill();
        }
        started
    }
}

/// Whether processes of a killed postmaster still hold its shared memory (judged by any
/// process whose parent was the postmaster named in the pid file).
fn backends_alive(pid_file: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read_to_string(pid_file) else {
        return false;
    };
    let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<u32>().ok())
    else {
        return false;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                let after = s.rsplit_once(')')?.1.to_owned();
                after.split_whitespace().nth(1)?.parse::<u32>().ok()
            })
            .is_some_and(|ppid| ppid == pid)
    })
}

impl Drop for Owned {
    /// A fast shutdown (SIGINT), so that PostgreSQL removes its shared memory (a killed one
    /// leaves a segment in `/dev/shm`); SIGKILL when it takes longer than five seconds.
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_gracefully(child, libc::SIGINT);
        }
    }
}

/// Signals a server this testkit started (by its pid) and waits up to five seconds for it to
/// exit, then kills it.
pub(crate) fn stop_gracefully(mut child: Child, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn bin_dir() -> io::Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    if let Some(p) = find_binary(&["postgres"], &[]) {
        if let Some(dir) = p.parent().filter(|d| d.join("initdb").is_file()) {
            return Ok(dir.to_owned());
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "PostgreSQL server binaries (initdb, postgres) not found: apt-get install postgresql \
         (scripts/test.sh does)",
    ))
}

/// An empty database on a [`PostgresServer`], dropped with this handle (with its
/// connections): its `url()` is `postgres://…/<this database>`,
/// and its `query()` runs [`PostgresServer::query`] in it.
pub type TestDatabase = super::db::TestDatabase<PostgresServer>;
