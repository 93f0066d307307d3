//! A backend from a URL: the one place that knows every scheme. The URL's parts are parsed by
//! the backends with the helpers of `url.rs`, which knows no backend.

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// The URL schemes this build understands, for error messages and `--help`.
pub const SCHEMES: &[&str] = &[
    "memory://",
    "sqlite:///abs/path.db",
    "redis://[user:pass@]host:port[/db]",
    "rediss://[user:pass@]host:port[/db]",
    "redis+sentinel://[user:pass@]host:port[,host:port]/master[?min_replicas=N]",
    "rediss+sentinel://[user:pass@]host:port[,host:port]/master[?ca_file=..]",
    "redis+cluster://[user:pass@]host:port[,host:port][?min_replicas=N]",
    "rediss+cluster://[user:pass@]host:port[,host:port][?ca_file=..]",
    "redlock://[user:pass@]host:port,host:port,host:port[/db]",
    "redlocks://[user:pass@]host:port,host:port,host:port[/db][?ca_file=..]",
    #[cfg(feature = "etcd")]
    "etcd://[user:pass@]host:port[,host:port]",
    #[cfg(feature = "etcd-tls")]
    "etcds://[user:pass@]host:port[,host:port][?ca_file=..]",
    #[cfg(feature = "postgres")]
    "postgres://[user:pass@]host:port/db[?table=..&sslmode=..]",
    #[cfg(feature = "mysql")]
    "mysql://[user:pass@]host:port/db[?table=..&ssl-mode=..]",
    #[cfg(feature = "zookeeper")]
    "zk://[user:pass@]host:port[,host:port][/root][?allow_insecure_auth=true]",
    #[cfg(feature = "zookeeper-tls")]
    "zks://[user:pass@]host:port[,host:port][/root]?ca_file=..[&cert_file=..&key_file=..]",
];

/// Connects to the backend named by `url`:
///
/// | URL | backend | feature |
/// |---|---|---|
/// | `memory://` | in this process | `memory` |
/// | `sqlite:///abs/path.db[?table=NAME]` | SQLite lease table | `sqlite` |
/// | `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS) | Redis, single node | `redis` |
/// | `redis+sentinel://[user:pass@]host:port[,host:port]/master[?params]`, `rediss+sentinel://…[?ca_file=…]` (TLS) | Redis under Sentinel: follows failover; acquisitions wait for `min_replicas` | `redis` |
/// | `redis+cluster://[user:pass@]host:port[,host:port][?params]`, `rediss+cluster://…[?ca_file=…]` (TLS) | Redis Cluster: slot routing, `MOVED`/`ASK`, follows failover and migrations; acquisitions wait for `min_replicas` | `redis` |
/// | `redlock://[user:pass@]host:port,host:port,host:port[/db]`, `redlocks://…[?ca_file=…]` (TLS) | Redlock over independent Redis masters | `redis` |
/// | `etcd://[user:pass@]host:port[,host:port]`, `etcds://…` (TLS) | etcd, `concurrency.Mutex` layout | `etcd` (`etcd-tls`) |
/// | `postgres://[user:pass@]host:port/db[?params]`, `postgresql://…` | PostgreSQL lease table | `postgres` |
/// | `mysql://[user:pass@]host:port/db[?params]`, `mariadb://…` | MySQL / MariaDB lease table | `mysql` |
/// | `zk://[user:pass@]host:port[,host:port][/root][?params]`, `zks://…` (TLS) | ZooKeeper, Curator `InterProcessMutex` layout | `zookeeper` (`zookeeper-tls`) |
///
/// The SQL parameters (`table`, `schema`, `region`, `spring`, `pool_size`, `connect_timeout`,
/// `sslmode` / `ssl-mode`, ...) are listed in [`backends::sql`](crate::backends::sql).
///
/// Every backend reads its URL with the same rules: user and password are percent-decoded, a
/// host list is `h1:p1,h2:p2` with IPv6 addresses in brackets, a boolean parameter is `true`,
/// `1`, `yes`, `on` or `false`, `0`, `no`, `off`, and a duration is `500ms`, `5s`, `1m` or
/// plain seconds.
///
/// A malformed URL is an [`Error::InvalidConfig`] naming the part that is wrong, and so is an
/// unknown query parameter (named; a `redis://` query is left to the `redis` crate); a scheme this build does not support is an
/// [`Error::Unsupported`]. Passwords never appear in errors.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let backend = distlock::connect("memory://").await?;
/// assert_eq!(backend.kind(), "memory");
/// assert!(distlock::connect("nosuch://x").await.is_err());
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
/// table, a root node) stays, as the next call would make it anyway.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let scheme = match url.split_once("://") {
        Some((s, _)) if !s.is_empty() => s.to_ascii_lowercase(),
        _ => {
            return Err(Error::config(format!(
                "backend URL {:?} has no scheme; expected one of {}",
                crate::url::redact(url),
                SCHEMES.join(", ")
            )))
        }
    };
    match scheme.as_str() {
        #[cfg(feature = "memory")]
        "memory" => Ok(Arc::new(crate::backends::memory::MemoryBackend::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(crate::backends::sqlite::SqliteBackend::from_url(
            url,
        )?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" => Ok(Arc::new(
            crate::backends::redis::RedisBackend::connect(url).await?,
        )),
        #[cfg(feature = "redis")]
        "redlock" | "redlocks" => Ok(Arc::new(
            crate::backends::redis::redlock::RedlockBackend::connect(url).await?,
        )),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(
            crate::backends::postgres::PostgresBackend::connect(url).await?,
        )),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(
            crate::backends::mysql::MySqlBackend::connect(url).await?,
        )),
        #[cfg(feature = "zookeeper")]
        "zk" | "zookeeper" | "zks" => Ok(Arc::new(
            crate::backends::zookeeper::ZooKeeperBackend::connect(url).await?,
        )),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(Arc::new(
            crate::backends::etcd::EtcdBackend::connect(url).await?,
        )),
        other => Err(Error::Unsupported {
            backend: "url",
            what: format!(
                "scheme {other:?} (this build supports {})",
                SCHEMES.join(", ")
            ),
        }),
    }
}
