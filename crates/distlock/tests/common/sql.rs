//! Helpers shared by the PostgreSQL and MariaDB test binaries (`sql_faults`, `sql_auth`,
//! `spring_jdbc`): backends and registries on a test database, fresh databases on the machine's
//! servers, killing and listing the database's sessions, TLS on a throwaway PostgreSQL server.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use distlock::backends::mysql::MySqlBackend;
use distlock::backends::postgres::PostgresBackend;
use distlock::{AcquireRequest, Attempt, Backend, LockName, LockRegistry, RegistryOptions, Token};
use distlock_testkit::mysql::{self, MariaDbServer};
use distlock_testkit::postgres::{self, PostgresServer};
use distlock_testkit::tls::TestCa;

/// A fresh database on the machine's PostgreSQL server (or a throwaway one).
pub fn pg_db() -> postgres::TestDatabase {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    server.fresh_database().unwrap()
}

/// A fresh database on the machine's MariaDB server (or a throwaway one).
pub fn my_db() -> mysql::TestDatabase {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    server.fresh_database().unwrap()
}

/// A fresh database on one of the two servers, for the checks that run on both: its URL, how a
/// backend connects to it, and what the fault tests do to its sessions.
pub enum SqlDb {
    /// On the PostgreSQL server.
    Postgres(postgres::TestDatabase),
    /// On the MariaDB server.
    MariaDb(mysql::TestDatabase),
}

impl SqlDb {
    /// A fresh database on the machine's PostgreSQL server (or a throwaway one).
    pub fn postgres() -> Self {
        SqlDb::Postgres(pg_db())
    }

    /// A fresh database on the machine's MariaDB server (or a throwaway one).
    pub fn mariadb() -> Self {
        SqlDb::MariaDb(my_db())
    }

    /// The URL that connects to the database.
    pub fn url(&self) -> &str {
        match self {
            SqlDb::Postgres(db) => db.url(),
            SqlDb::MariaDb(db) => db.url(),
        }
    }

    /// The backend of this server's kind, for any URL (such as one through a proxy).
    pub fn connector(&self) -> fn(&str) -> BoxBackend {
        match self {
            SqlDb::Postgres(_) => pg_boxed,
            SqlDb::MariaDb(_) => my_boxed,
        }
    }

    /// A new backend on the database.
    pub async fn backend(&self) -> Arc<dyn Backend> {
        self.connector()(self.url()).await
    }

    /// Runs `sql` in the database, as its administrator.
    pub fn query(&self, sql: &str) -> std::io::Result<Vec<Vec<Option<String>>>> {
        match self {
            SqlDb::Postgres(db) => db.query(sql),
            SqlDb::MariaDb(db) => db.query(sql),
        }
    }

    /// Has the server end every other session on the database; how many there were.
    pub fn kill_connections(&self) -> usize {
        match self {
            SqlDb::Postgres(db) => pg_kill_connections(db),
            SqlDb::MariaDb(db) => my_kill_connections(db),
        }
    }

    /// The ids of the other sessions on the database.
    pub fn sessions(&self) -> BTreeSet<String> {
        match self {
            SqlDb::Postgres(db) => pg_sessions(db),
            SqlDb::MariaDb(db) => my_sessions(db),
        }
    }
}

pub fn opts(lease_ms: u64) -> RegistryOptions {
    RegistryOptions::default()
        .with_prefix("faults")
        .with_lease(Duration::from_millis(lease_ms))
}

pub async fn pg(url: &str) -> Arc<dyn Backend> {
    Arc::new(PostgresBackend::connect(url).await.expect("connect"))
}

pub async fn my(url: &str) -> Arc<dyn Backend> {
    Arc::new(MySqlBackend::connect(url).await.expect("connect"))
}

pub fn registry(backend: Arc<dyn Backend>, opts: RegistryOptions) -> LockRegistry {
    LockRegistry::from_backend(backend, opts).unwrap()
}

pub fn pg_kill_connections(db: &postgres::TestDatabase) -> usize {
    let rows = db
        .query(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            db.name()
        ))
        .expect("terminate");
    rows.len()
}

pub fn my_kill_connections(db: &mysql::TestDatabase) -> usize {
    let ids = db
        .query(&format!(
            "SELECT id FROM information_schema.processlist \
             WHERE db = '{}' AND id <> CONNECTION_ID()",
            db.name()
        ))
        .expect("processlist");
    let kills: Vec<String> = ids
        .iter()
        .filter_map(|r| r[0].clone())
        .map(|id| format!("KILL {id}"))
        .collect();
    if !kills.is_empty() {
        // A connection may have ended by itself meanwhile: ignore "unknown thread".
        for k in &kills {
            let _ = db.query(k);
        }
    }
    kills.len()
}

/// A backend being connected, for helpers that take a connector as a plain `fn`.
pub type BoxBackend = std::pin::Pin<Box<dyn std::future::Future<Output = Arc<dyn Backend>> + Send>>;

pub fn pg_boxed(url: &str) -> BoxBackend {
    let url = url.to_owned();
    Box::pin(async move { pg(&url).await })
}

pub fn my_boxed(url: &str) -> BoxBackend {
    let url = url.to_owned();
    Box::pin(async move { my(&url).await })
}

/// Switches TLS on in a throwaway PostgreSQL server with the CA's server certificate (and the
/// CA for client certificates), with a reload.
pub fn pg_enable_tls(db: &postgres::TestDatabase, ca: &TestCa) {
    let data_dir = db.query("SHOW data_directory").unwrap()[0][0]
        .clone()
        .unwrap();
    for (from, to) in [
        ("server.crt", "server.crt"),
        ("server.key", "server.key"),
        ("ca.crt", "root.crt"),
    ] {
        let dest = Path::new(&data_dir).join(to);
        std::fs::copy(ca.path(from), &dest).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).unwrap();
        let owner = std::fs::metadata(&data_dir).unwrap();
        use std::os::unix::fs::MetadataExt;
        std::os::unix::fs::chown(&dest, Some(owner.uid()), Some(owner.gid())).unwrap();
    }
    db.query("ALTER SYSTEM SET ssl = on").unwrap();
    db.query("ALTER SYSTEM SET ssl_ca_file = 'root.crt'")
        .unwrap();
    db.query("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(300));
}

/// `url` with its host and port replaced (its user, password and parameters kept).
pub fn with_host(url: &str, host: &str, port: u16) -> url::Url {
    let mut u = url::Url::parse(url).unwrap();
    u.set_host(Some(host)).unwrap();
    u.set_port(Some(port)).unwrap();
    u
}

pub fn server_addr(url: &str) -> std::net::SocketAddr {
    let u = url::Url::parse(url).unwrap();
    let port = u
        .port()
        .unwrap_or(if u.scheme() == "mysql" { 3306 } else { 5432 });
    format!("{}:{port}", u.host_str().unwrap()).parse().unwrap()
}

pub fn pg_sessions(db: &postgres::TestDatabase) -> BTreeSet<String> {
    db.query(&format!(
        "SELECT pid::text FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid()",
        db.name()
    ))
    .unwrap()
    .into_iter()
    .filter_map(|r| r[0].clone())
    .collect()
}

pub fn my_sessions(db: &mysql::TestDatabase) -> BTreeSet<String> {
    db.query(&format!(
        "SELECT id FROM information_schema.processlist WHERE db = '{}' AND id <> CONNECTION_ID()",
        db.name()
    ))
    .unwrap()
    .into_iter()
    .filter_map(|r| r[0].clone())
    .collect()
}

/// Takes the lock `key` on `backend` itself (no registry) and releases it: the backend works.
pub async fn acquire_and_release(backend: &impl Backend, key: &str) {
    let name = LockName::new("lock", key).unwrap();
    let token = Token::random();
    assert!(matches!(
        backend
            .acquire(&AcquireRequest::new(
                name.clone(),
                token,
                Duration::from_secs(5)
            ))
            .await
            .unwrap(),
        Attempt::Acquired { .. }
    ));
    assert!(backend.release(&name, token).await.unwrap().was_held);
}
