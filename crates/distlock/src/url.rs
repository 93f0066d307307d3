//! A backend from a URL: the one place that knows every scheme.

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// The URL schemes this build understands, for error messages and `--help`.
pub const SCHEMES: &[&str] = &[
    "memory://",
    "sqlite:///abs/path.db",
    "redis://[user:pass@]host:port[/db]",
    "rediss://[user:pass@]host:port[/db]",
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
/// | `etcd://[user:pass@]host:port[,host:port]`, `etcds://…` (TLS) | etcd, `concurrency.Mutex` layout | `etcd` (`etcd-tls`) |
/// | `postgres://[user:pass@]host:port/db[?params]`, `postgresql://…` | PostgreSQL lease table | `postgres` |
/// | `mysql://[user:pass@]host:port/db[?params]`, `mariadb://…` | MySQL / MariaDB lease table | `mysql` |
/// | `zk://[user:pass@]host:port[,host:port][/root][?params]`, `zks://…` (TLS) | ZooKeeper, Curator `InterProcessMutex` layout | `zookeeper` (`zookeeper-tls`) |
///
/// The SQL parameters (`table`, `schema`, `region`, `spring`, `pool_size`, `connect_timeout`,
/// `sslmode` / `ssl-mode`, ...) are listed in [`backends::sql`](crate::backends::sql).
///
/// A malformed URL is an [`Error::InvalidConfig`] naming the part that is wrong; a scheme this
/// build does not support is an [`Error::Unsupported`]. Passwords never appear in errors.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let backend = distlock::connect("memory://").await?;
/// assert_eq!(backend.kind(), "memory");
/// assert!(distlock::connect("nosuch://x").await.is_err());
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let scheme = match url.split_once("://") {
        Some((s, _)) if !s.is_empty() => s.to_ascii_lowercase(),
        _ => {
            return Err(Error::config(format!(
                "backend URL {:?} has no scheme; expected one of {}",
                redact(url),
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
        "redis" | "rediss" => Ok(Arc::new(
            crate::backends::redis::RedisBackend::connect(url).await?,
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

/// The URL with any password replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => match (url.find("://"), url.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
            _ => url.to_owned(),
        },
    }
}

/// Decodes `%XX` escapes of a URL part; `None` for a broken escape or a result that is not
/// UTF-8.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "zookeeper"
))]
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A duration parameter of a `kind` URL: `500ms`, `5s`, `2m`, or plain seconds.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "zookeeper"
))]
pub(crate) fn parse_duration(kind: &str, param: &str, value: &str) -> Result<std::time::Duration> {
    use std::time::Duration;
    let bad = || {
        Error::config(format!(
            "{kind} URL: the query parameter '{param}' must be a duration like 500ms, 5s or 1m, \
             got {value:?}"
        ))
    };
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs).ok_or_else(bad),
        _ => Err(bad()),
    }
}
