//! A backend from a URL, and a registry over it ([`LockRegistry::connect`]): the one place
//! that knows every scheme, above the registry so that the core depends on no backend. The
//! URL's parts are parsed by the backends with the helpers of `url.rs`, which knows no backend.

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::options::RegistryOptions;
use crate::registry::LockRegistry;

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
/// The SQL parameters (`table`, `schema`, `region`, `spring`, `layout`, `pool_size`, `connect_timeout`,
/// `sslmode` / `ssl-mode`, ...) are listed in [`backends::sql`](crate::backends::sql).
///
/// Every backend reads its URL with the same rules: user and password are percent-decoded, a
/// host list is `h1:p1,h2:p2` with IPv6 addresses in brackets, a boolean parameter is `true`,
/// `1`, `yes`, `on` or `false`, `0`, `no`, `off`, and a duration follows the rule of
/// [`duration::parse_duration`](crate::duration::parse_duration) (`500ms`, `5s`, `1h`, `1m30s`,
/// or a number of seconds), the same as the `distlock` command's options.
///
/// A malformed URL is an [`Error::InvalidConfig`] naming the part that is wrong, and so is an
/// unknown query parameter (named; a `redis://` query is left to the `redis` crate) and an
/// unknown scheme (named, with the known ones). A scheme whose backend this build leaves out
/// (its cargo feature is off) is an [`Error::Unsupported`]. Passwords never appear in errors.
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
                "backend URL {}: no scheme (known: {})",
                shown_url(url),
                known_schemes()
            )))
        }
    };
    match scheme.as_str() {
        #[cfg(feature = "memory")]
        "memory" => match url.split_once("://") {
            Some((_, "")) => Ok(Arc::new(crate::backends::memory::MemoryBackend::new())),
            _ => Err(Error::config(format!(
                "memory URL {}: memory:// takes no host, path or parameters",
                shown_url(url)
            ))),
        },
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
        other => Err(match FEATURES.iter().find(|(s, _)| *s == other) {
            Some((_, feature)) => Error::Unsupported {
                backend: "url",
                what: format!("scheme {other:?} (this build lacks the cargo feature {feature:?})"),
            },
            None => Error::config(format!(
                "backend URL {}: unknown scheme {} (known: {})",
                shown_url(url),
                crate::ShortKey(other),
                known_schemes()
            )),
        }),
    }
}

/// Every scheme distlock knows, with the cargo feature that builds its backend.
const FEATURES: &[(&str, &str)] = &[
    ("memory", "memory"),
    ("sqlite", "sqlite"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+sentinel", "redis"),
    ("rediss+sentinel", "redis"),
    ("redis+cluster", "redis"),
    ("rediss+cluster", "redis"),
    ("redlock", "redis"),
    ("redlocks", "redis"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("zk", "zookeeper"),
    ("zookeeper", "zookeeper"),
    ("zks", "zookeeper-tls"),
    ("etcd", "etcd"),
    ("etcds", "etcd-tls"),
];

/// The schemes of this build, for a short message (the forms are in [`SCHEMES`]).
fn known_schemes() -> String {
    FEATURES
        .iter()
        .filter(|(scheme, _)| built(scheme))
        .map(|(scheme, _)| *scheme)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether this build connects to `scheme` (of [`FEATURES`]).
fn built(scheme: &str) -> bool {
    FEATURES
        .iter()
        .any(|(s, feature)| *s == scheme && FEATURES_ON.contains(feature))
}

/// The cargo features of [`FEATURES`] this build has.
const FEATURES_ON: &[&str] = &[
    #[cfg(feature = "memory")]
    "memory",
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "redis")]
    "redis",
    #[cfg(feature = "postgres")]
    "postgres",
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "zookeeper")]
    "zookeeper",
    #[cfg(feature = "zookeeper-tls")]
    "zookeeper-tls",
    #[cfg(feature = "etcd")]
    "etcd",
    #[cfg(feature = "etcd-tls")]
    "etcd-tls",
];

/// A URL as an error message shows it: without its password, and shortened as keys are.
fn shown_url(url: &str) -> String {
    crate::ShortKey(&crate::url::redact(url)).to_string()
}

impl LockRegistry {
    /// Connects to the backend named by `url` (see [`crate::connect`]) and builds a registry.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect(url: &str, options: RegistryOptions) -> Result<Self> {
        Self::from_backend(connect(url).await?, options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_error(url: &str) -> String {
        match futures_util::FutureExt::now_or_never(connect(url)) {
            Some(Err(Error::InvalidConfig(m))) => m,
            Some(Err(e)) => panic!("{url}: {e:?}"),
            Some(Ok(_)) => panic!("{url}: connected"),
            None => panic!("{url}: did not answer at once"),
        }
    }

    #[test]
    fn an_unknown_scheme_is_a_short_configuration_error() {
        let m = config_error("foo://bar");
        assert!(m.contains("unknown scheme \"foo\""), "{m}");
        assert!(m.len() < 300, "{} characters: {m}", m.len());
        for scheme in FEATURES.iter().map(|(s, _)| *s).filter(|s| built(s)) {
            assert!(m.contains(scheme), "{scheme} missing: {m}");
        }
        let m = config_error("no-scheme-at-all");
        assert!(m.contains("no scheme") && m.len() < 300, "{m}");
        let m = config_error(&format!("{}://x", "y".repeat(10_000)));
        assert!(m.len() < 400, "{} characters", m.len());
        let m = config_error("foo://u:hunter2@bar");
        assert!(!m.contains("hunter2"), "{m}");
        if cfg!(feature = "memory") {
            let m = config_error("memory://?x=1");
            assert!(m.contains("memory://"), "{m}");
        }
    }

    #[test]
    fn every_known_scheme_has_its_form_listed() {
        for (scheme, _) in FEATURES.iter().filter(|(s, _)| built(s)) {
            let canonical = match *scheme {
                "postgresql" => "postgres",
                "mariadb" => "mysql",
                "zookeeper" => "zk",
                s => s,
            };
            assert!(
                SCHEMES
                    .iter()
                    .any(|f| f.starts_with(&format!("{canonical}://"))),
                "{scheme}"
            );
        }
    }
}
