//! Throwaway servers for the benchmarks' `--spawn KIND`, started through distlock's testkit.

#[cfg(feature = "sql")]
use std::sync::Arc;

/// A throwaway server started through distlock's testkit for `--spawn KIND`: its URL, its pid
/// when known, and what keeps it (and its files) alive until dropped.
pub struct Spawned {
    /// The backend URL.
    pub url: String,
    /// The server process, when known.
    pub pid: Option<u32>,
    _keep: Vec<Box<dyn std::any::Any>>,
}

/// A fresh database on a throwaway database server.
#[cfg(feature = "sql")]
fn database<S: 'static, D: 'static>(
    server: std::io::Result<S>,
    fresh: impl FnOnce(&Arc<S>) -> std::io::Result<D>,
    url: impl FnOnce(&D) -> String,
) -> std::io::Result<Spawned> {
    let server = Arc::new(server?);
    let db = fresh(&server)?;
    Ok(Spawned {
        url: url(&db),
        pid: None,
        // The database goes first, while its server still runs.
        _keep: vec![Box::new(db), Box::new(server)],
    })
}

/// A directory removed with its content when dropped (the SQLite file of `--spawn sqlite`).
struct ScratchDir(std::path::PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts a throwaway server of `kind` (sqlite, redis, postgres, mysql, zookeeper, etcd; each
/// with its feature of this crate).
pub fn spawn(kind: &str) -> Result<Spawned, String> {
    let failed = |e: std::io::Error| format!("starting a throwaway {kind} server: {e}");
    let keep = |url: String, pid: Option<u32>, k: Vec<Box<dyn std::any::Any>>| Spawned {
        url,
        pid,
        _keep: k,
    };
    match kind {
        "sqlite" => {
            let dir = ScratchDir(std::env::temp_dir().join(format!(
                "distlock-scale-{}-{}",
                std::process::id(),
                crate::mono_ns()
            )));
            std::fs::create_dir_all(&dir.0).map_err(failed)?;
            let url = format!("sqlite://{}", dir.0.join("scale.db").display());
            Ok(keep(url, None, vec![Box::new(dir)]))
        }
        #[cfg(feature = "redis")]
        "redis" => {
            let server = distlock_testkit::redis::RedisServer::start().map_err(failed)?;
            Ok(keep(server.url(), server.pid(), vec![Box::new(server)]))
        }
        #[cfg(feature = "sql")]
        "postgres" => database(
            distlock_testkit::postgres::PostgresServer::start(),
            |s| s.fresh_database(),
            |d| d.url().to_owned(),
        )
        .map_err(failed),
        #[cfg(feature = "sql")]
        "mysql" => database(
            distlock_testkit::mysql::MariaDbServer::start(),
            |s| s.fresh_database(),
            |d| d.url().to_owned(),
        )
        .map_err(failed),
        #[cfg(feature = "zookeeper")]
        "zookeeper" => {
            let server = distlock_testkit::zookeeper::ZooKeeperServer::start().map_err(failed)?;
            Ok(keep(server.url(), None, vec![Box::new(server)]))
        }
        #[cfg(feature = "etcd")]
        "etcd" => {
            let server = distlock_testkit::etcd::EtcdServer::start().map_err(failed)?;
            Ok(keep(server.url(), None, vec![Box::new(server)]))
        }
        other => Err(format!(
            "--spawn {other}: not one of sqlite, redis, postgres, mysql, zookeeper, etcd, or \
             its feature of distlock-bench was not built"
        )),
    }
}

/// What a bench binary runs against, `--backend URL` or `--spawn KIND`, and whether it prints
/// JSON lines (`--json`).
#[derive(Debug, Default)]
pub struct Target {
    /// The URL of `--backend`, or empty.
    pub backend: String,
    /// The kind of `--spawn`.
    pub spawn: Option<String>,
    /// Whether `--json` was given.
    pub json: bool,
}

impl Target {
    /// Reads `argv` as `--json` and `--flag value` pairs: `--backend` and `--spawn` here, any
    /// other flag and its value handed to `other`. `usage` follows this parser's own error
    /// messages (empty where the caller adds it).
    ///
    /// # Errors
    /// A flag without a value, an error of `other`, or not exactly one of `--backend` and
    /// `--spawn`.
    pub fn parse(
        argv: &[String],
        usage: &str,
        mut other: impl FnMut(&str, &str) -> Result<(), String>,
    ) -> Result<Target, String> {
        let mut t = Target::default();
        let mut it = argv.iter();
        while let Some(flag) = it.next() {
            if flag == "--json" {
                t.json = true;
                continue;
            }
            let value = it
                .next()
                .ok_or_else(|| format!("{flag} needs a value{usage}"))?;
            match flag.as_str() {
                "--backend" => t.backend = value.clone(),
                "--spawn" => t.spawn = Some(value.clone()),
                _ => other(flag, value)?,
            }
        }
        if t.backend.is_empty() == t.spawn.is_none() {
            return Err(format!("one of --backend and --spawn is required{usage}"));
        }
        Ok(t)
    }
}
