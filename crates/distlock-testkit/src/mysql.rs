//! MariaDB (or MySQL) for tests: a fresh database per test on the machine's running server, or
//! a throwaway server of the test's own.
//!
//! [`MariaDbServer::machine_or_start`] looks for a server at `127.0.0.1:3306` (user `root`
//! without password, or the admin URL in `DISTLOCK_TEST_MYSQL_URL`) and otherwise starts a
//! throwaway one for the test process; `DISTLOCK_TEST_THROWAWAY=1` always starts one.
//! [`MariaDbServer::start`] always starts a throwaway server (`mariadb-install-db`, then
//! `mariadbd` on a free loopback port, as the `mysql` user when the tests run as root). Missing
//! binaries are an error that says what to install, never a skip.

use std::fmt;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::db::kit::*;

const DIR_PREFIX: &str = "distlock-testkit-mariadb";

/// A MariaDB server for tests: the machine's own, or a throwaway one.
pub struct MariaDbServer {
    mode: Mode,
}

enum Mode {
    Machine { base: String },
    Owned(Mutex<Owned>),
}

struct Owned {
    server_bin: PathBuf,
    dir: TempDir,
    port: u16,
    ids: Option<(u32, u32)>,
    child: Option<Child>,
    /// More server options, such as the TLS files.
    extra_args: Vec<String>,
}

database_server_controls!(MariaDbServer, "MariaDB", "mariadb-server");

impl MariaDbServer {
    fn machine() -> Option<MariaDbServer> {
        let (addr, _, base) = machine_admin(
            "DISTLOCK_TEST_MYSQL_URL",
            "mysql://root@127.0.0.1:3306",
            3306,
        )?;
        let server = MariaDbServer {
            mode: Mode::Machine { base },
        };
        if_answers(server, "MariaDB", addr, |s| s.query(None, "SELECT 1"))
    }

    /// Starts a throwaway server of this test's own. Dropping it kills the server and removes
    /// its directory.
    ///
    /// # Errors
    /// When the MariaDB binaries are missing (`apt-get install mariadb-server`), or the server
    /// does not come up within 30 seconds (the message includes its log).
    pub fn start() -> io::Result<MariaDbServer> {
        Self::start_with_args(&[])
    }

    /// [`start`](Self::start) with more `mariadbd` options, such as
    /// `--ssl-cert=/path/server.crt` (files the server reads must be readable by the `mysql`
    /// user when the tests run as root).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with_args(args: &[&str]) -> io::Result<MariaDbServer> {
        remove_leftover_dirs(DIR_PREFIX);
        let sbin = [PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")];
        let missing = || {
            io::Error::new(
                io::ErrorKind::NotFound,
                "MariaDB server binaries (mariadb-install-db, mariadbd) not found: apt-get \
                 install mariadb-server (scripts/test.sh does)",
            )
        };
        let install =
            find_binary(&["mariadb-install-db", "mysql_install_db"], &sbin).ok_or_else(missing)?;
        let server_bin = find_binary(&["mariadbd", "mysqld"], &sbin).ok_or_else(missing)?;
        let dir = TempDir::new(DIR_PREFIX)?;
        let ids = server_ids("mysql", "MariaDB", "mariadb-server")?;
        if let Some((uid, gid)) = ids {
            chown_tree(dir.path(), uid, gid)?;
        }
        // A private tmpdir: concurrent installs sharing /tmp trip over each other's temporary
        // tables.
        std::fs::create_dir_all(dir.path().join("tmp"))?;
        if let Some((uid, gid)) = ids {
            chown_tree(&dir.path().join("tmp"), uid, gid)?;
        }
        let mut cmd = Command::new(&install);
        cmd.arg("--no-defaults")
            .arg(format!("--tmpdir={}", dir.path().join("tmp").display()))
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ])
            .stdin(Stdio::null());
        if let Some((uid, gid)) = ids {
            cmd.uid(uid).gid(gid);
        }
        run_setup(cmd, &install.display().to_string())?;
        let mut owned = Owned {
            server_bin,
            dir,
            port: 0,
            ids,
            child: None,
            extra_args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        launch_on_free_port("mariadbd", |port| {
            owned.port = port;
            owned.launch()
        })?;
        Ok(MariaDbServer {
            mode: Mode::Owned(Mutex::new(owned)),
        })
    }

    /// `mysql://root@127.0.0.1:port/<database>`.
    pub fn url(&self, database: &str) -> String {
        match &self.mode {
            Mode::Machine { base } => format!("{base}/{database}"),
            Mode::Owned(o) => {
                let o = o.lock().unwrap_or_else(|e| e.into_inner());
                format!("mysql://root@127.0.0.1:{}/{database}", o.port)
            }
        }
    }

    /// Runs `sql` (one or more statements) in `database` (or none) and returns the rows of the
    /// last statement that had any, as text.
    pub fn query(&self, database: Option<&str>, sql: &str) -> io::Result<Vec<Vec<Option<String>>>> {
        let url = self.url(database.unwrap_or(""));
        let sql = sql.to_owned();
        block_on(async move {
            let opts = mysql_async::Opts::from_url(&url)
                .map_err(|e| io::Error::other(format!("mysql: {e}")))?;
            let mut conn =
                tokio::time::timeout(Duration::from_secs(10), mysql_async::Conn::new(opts))
                    .await
                    .map_err(|_| io::Error::other("mysql: no connection within 10 s"))?
                    .map_err(|e| io::Error::other(format!("mysql: {e}")))?;
            let mut result = conn
                .query_iter(sql.as_str())
                .await
                .map_err(|e| io::Error::other(format!("mysql: {sql}: {e}")))?;
            let mut rows: Vec<mysql_async::Row> = Vec::new();
            loop {
                let set: Vec<mysql_async::Row> = result
                    .collect()
                    .await
                    .map_err(|e| io::Error::other(format!("mysql: {sql}: {e}")))?;
                if !set.is_empty() {
                    rows = set;
                }
                if result.is_empty() {
                    break;
                }
            }
            drop(result);
            let _ = conn.disconnect().await;
            Ok(rows
                .into_iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| match r.as_ref(i) {
                            Some(mysql_async::Value::NULL) | None => None,
                            Some(mysql_async::Value::Bytes(b)) => {
                                Some(String::from_utf8_lossy(b).into_owned())
                            }
                            Some(v) => Some(v.as_sql(true)),
                        })
                        .collect()
                })
                .collect())
        })?
    }
}

impl DatabaseServer for MariaDbServer {
    fn database_url(&self, database: &str) -> String {
        self.url(database)
    }

    fn query_in(&self, database: &str, sql: &str) -> io::Result<Rows> {
        self.query(Some(database), sql)
    }

    fn test_databases(&self) -> io::Result<Vec<String>> {
        let rows = self.query(
            None,
            "SELECT schema_name FROM information_schema.schemata \
             WHERE schema_name LIKE 'distlock\\_t%'",
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
            .collect())
    }

    fn create_database(&self, name: &str) -> io::Result<()> {
        self.query(None, &format!("CREATE DATABASE `{name}`"))
            .map(drop)
    }

    fn drop_database(&self, name: &str) {
        let _ = self.query(None, &format!("DROP DATABASE IF EXISTS `{name}`"));
    }
}

impl Owned {
    fn kill(&mut self) {
        process::kill(&mut self.child);
    }

    fn launch(&mut self) -> io::Result<()> {
        let log_path = self.dir.path().join("mariadb.log");
        let log = process::open_log(&log_path)?;
        let mut cmd = Command::new(&self.server_bin);
        cmd.arg("--no-defaults")
            .arg(format!(
                "--datadir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!(
                "--socket={}",
                self.dir.path().join("sock").display()
            ))
            .arg(format!(
                "--tmpdir={}",
                self.dir.path().join("tmp").display()
            ))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-buffer-pool-size=32M",
                "--max-connections=300",
            ])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.stdout)
            .stderr(log.stderr);
        let start = StartUp {
            what: "mariadbd",
            log_path: &log_path,
            log_start: log.start,
            ready: "ready for connections",
            port_taken: &["Address already in use", "Can't start server: Bind"],
        };
        let started = spawn_until_ready(cmd, self.ids, &mut self.child, self.port, &start);
        if started.is_err() {
            self.kill();
        }
        started
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An empty database on a [`MariaDbServer`], dropped with this handle: its
/// `url()` is `mysql://…/<this database>`, and its
/// `query()` runs [`MariaDbServer::query`] in it.
pub type TestDatabase = super::db::TestDatabase<MariaDbServer>;
