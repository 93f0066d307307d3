//! ZooKeeper backend: the layout of Apache Curator's `InterProcessMutex`, so that Curator, Spring
//! Integration's `ZookeeperLockRegistry` and distlock exclude each other on the same path.
//!
//! | what | layout |
//! |---|---|
//! | lock of `key` | parent node `<root>/<key>`, a container node created on demand (the server reaps it when empty) |
//! | contender | ephemeral sequential child `_c_<uuid>-lock-<seq>` (Curator's protected mode: the `_c_<uuid>-` prefix lets its creator find it after a connection loss during the create); distlock's `<uuid>` is the acquisition's 128-bit owner token |
//! | holder | the contender with the lowest sequence number |
//! | waiting | each waiter watches only its predecessor (no herd); contenders are served in arrival order |
//! | fence | the holder node's `czxid` (the zxid of the transaction that created it) |
//! | lease | the ZooKeeper session, sized to the lease (see below) |
//! | `<root>` | the URL's path, else `/<prefix>` (`/lock` by default); Spring's registry uses `/SpringIntegration-LockRegistry` |
//!
//! # URL
//!
//! `zk://[user:password@]host:port[,host:port...][/root][?session_timeout=30s&connect_timeout=5s&request_timeout=5s&insecure_auth=true]`
//!
//! - several hosts form one ensemble; the client moves between them on failure;
//! - `user:password` authenticates with the `digest` scheme (`addauth digest user:password`), and
//!   every node is then created with the `CREATOR_ALL` ACL, so only clients with the same
//!   credentials can take, wait for or delete these locks; without credentials nodes are open
//!   (`OPEN_ACL_UNSAFE`, as Curator's default). The digest scheme sends the password as it is
//!   and this backend has no TLS yet, so a URL with credentials is refused unless it also says
//!   `insecure_auth=true` (use it only on a network you trust);
//! - the path is the root of every lock (percent-decoded), replacing the default `/<prefix>`;
//! - `session_timeout` (default 30 s): the session of operations that hold nothing (status,
//!   listing, [`client`](ZooKeeperBackend::client)); holds get sessions sized to their lease
//!   (below). `connect_timeout` (default 5 s: establishing a session), `request_timeout`
//!   (default 5 s: one operation while the connection is down).
//!
//! # Keys
//!
//! A key is one path component: `/`, `%`, the characters ZooKeeper rejects in paths (controls,
//! U+007F..U+009F, U+D800..U+F8FF, U+FFF0 and above, which includes every character outside the
//! Basic Multilingual Plane) are percent-encoded as their UTF-8 bytes (`a/b` becomes `a%2Fb`),
//! and the components `.` and `..` become `%2E` and `%2E%2E`. Everything else is kept, so the
//! usual keys (`voucher:42`, `order-7`) have the same path as in Curator or Spring. The mapping is
//! reversible: [`decode_key`] undoes [`encode_key`]. The prefix is encoded the same way when it
//! names the default root.
//!
//! # Leases, sessions and loss
//!
//! A ZooKeeper lock lives as long as its holder's session: the server deletes the ephemeral node
//! when the session ends, which it does a session timeout after it last heard from the client.
//! **The session is sized to the lease**: a hold with lease `L` lives in a session whose timeout
//! is `L` (one session per distinct lease, shared by every hold of that lease in this backend),
//! so a holder that stops (crash, pause, cut network) frees the lock after its lease plus at
//! most one server `tickTime` (the server ends sessions on tick boundaries; 2 s by default), as
//! on every other backend. A lease the server cannot grant (outside its
//! `minSessionTimeout`..`maxSessionTimeout`, 2..20 `tickTime` by default, so 4 s..40 s) is an
//! [`Error::InvalidConfig`] when acquiring; a hold cannot be extended beyond the lease it was
//! taken with.
//!
//! The registry's lease is kept on the client side too, counted from before the request that
//! confirmed it: the server heard from the session after that, so the client's view ends no
//! later than the server's. A hold that is not renewed before its lease ends deletes its own
//! node. Renewal ([`Backend::extend`]) confirms that the session is alive and the holder's node
//! still exists; it answers `false` at once when the client saw its session expire, and when the
//! node was deleted underneath, so the guard learns it lost the lock.
//!
//! **Reads go through the leader.** A follower cut off from the leader keeps answering reads
//! from its own copy for up to `syncLimit × tickTime`, while the leader may expire the session
//! of a client connected to it. So renewals, and a waiter's check of its place, send a `sync`
//! first (pipelined, no extra round trip to wait for): a follower without a leader cannot answer
//! it, the renewal fails, and the holder is told at its lease's end. One narrow window remains:
//! a follower cut off within half a tick after it forwarded a renewal may not have reported that
//! renewal to the leader, which then counts the session from the renewal before (at most a
//! third of the lease earlier); there the fence is the protection.
//!
//! # Fences
//!
//! The fence is the holder node's `czxid`: 64 bits, the leader epoch in the high half and a
//! counter in the low half, increasing with every transaction of the whole ensemble. Unlike the
//! sequence number, which restarts at zero when the server reaps the empty parent and a new one
//! is created, it keeps increasing per key ([`Fencing::Monotonic`]). A server that loses its data
//! starts counting again, so fences are not kept across data loss.
//!
//! # Round trips
//!
//! An uncontended acquisition is one round trip (the create and the children listing are
//! pipelined on the session, which ZooKeeper processes in order), a release one more. The first
//! acquisition of a key in a process also pipelines the creation of its parent.

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, SessionState};

pub use zookeeper_client;

use crate::backend::{
    Attempt, Backend, Capabilities, Fencing, LockInfo, LockName, ReleaseSignals,
    ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};
use crate::url::percent_decode;

const KIND: &str = "zookeeper";
/// Curator's lock name of `InterProcessMutex` (and Spring's `ZookeeperLockRegistry`).
const LOCK_NAME: &str = "lock-";
/// Curator's protected-mode prefix.
const PROTECTED: &str = "_c_";
const DEFAULT_PORT: u16 = 2181;
/// Parents known to exist that are remembered per backend before the memory is cleared.
const MAX_KNOWN_PARENTS: usize = 10_000;
/// Attempts within one acquisition call when nodes vanish under it.
const MAX_SETTLE: usize = 5;

/// Settings of [`ZooKeeperBackend`]; the URL's query parameters set the same fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZooKeeperOptions {
    /// Session timeout asked of the server (default 30 s); the server clamps it to its
    /// `minSessionTimeout`..`maxSessionTimeout`. Keep leases at most this long (see the module
    /// docs).
    pub session_timeout: Duration,
    /// Time allowed to establish a session (default 5 s).
    pub connect_timeout: Duration,
    /// Time allowed for one operation (default 5 s). Requests made while the connection is down
    /// wait for it to come back for at most this long, then fail as unavailable.
    pub request_timeout: Duration,
    /// Root of every lock; `None` means `/<prefix>` (`/lock` with the default prefix).
    pub root: Option<String>,
}

impl Default for ZooKeeperOptions {
    fn default() -> Self {
        ZooKeeperOptions {
            session_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            root: None,
        }
    }
}

/// Locks on a ZooKeeper ensemble (`zk://host:port[,host:port][/root]`), in Curator's
/// `InterProcessMutex` layout. See the [module docs](self).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use distlock::{LockRegistry, RegistryOptions};
/// use distlock::backends::zookeeper::ZooKeeperBackend;
/// let backend = ZooKeeperBackend::connect("zk://127.0.0.1:2181").await?;
/// let registry = LockRegistry::with_options(backend, RegistryOptions::default())?;
/// let guard = registry.obtain("voucher:42")?.lock().await?; // node /lock/voucher:42/_c_…-lock-…
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct ZooKeeperBackend {
    inner: Arc<Inner>,
}

struct Inner {
    /// `host:port,host:port`, as the client's connect string.
    hosts: String,
    /// Digest credentials `user:password`; never printed.
    auth: Option<Vec<u8>>,
    options: ZooKeeperOptions,
    /// One session per session timeout: the session of reads that hold nothing
    /// (`options.session_timeout`) and one per distinct lease, sized to it.
    sessions: Mutex<HashMap<Duration, Arc<Slot>>>,
    /// This process's contender nodes by owner token.
    nodes: Mutex<HashMap<Token, Node>>,
    /// Lock parents this backend has seen exist (saves their creation on later acquisitions).
    parents: Mutex<HashSet<String>>,
    /// Wake-ups of waiters, by token: the watch on a waiter's predecessor fires its token.
    signals: Arc<ReleaseSignals>,
}

/// The session of one session timeout, re-established when it ends.
#[derive(Default)]
struct Slot {
    conn: Mutex<Option<Arc<Conn>>>,
    connecting: tokio::sync::Mutex<()>,
    /// When establishing a session last failed: callers queued behind that attempt fail fast
    /// instead of each waiting for a connect timeout of their own.
    last_connect_failure: Mutex<Option<Instant>>,
}

/// Entry ids of [`Node`].
static NEXT_NODE_ID: AtomicU64 = AtomicU64::new(1);

/// One ZooKeeper session.
struct Conn {
    client: Client,
    session: i64,
    /// The session timeout asked for (the key of its [`Slot`]).
    slot: Duration,
}

/// The session timeout that makes a session end with a lease: the lease in whole milliseconds
/// (rounded up), the unit in which ZooKeeper negotiates it.
fn session_of_lease(lease: Duration) -> Duration {
    let ms = lease.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// A contender node of this process.
struct Node {
    /// Tells this entry from an earlier one of the same token (a create task settles only the
    /// entry it was started for).
    id: u64,
    parent: String,
    /// The session timeout of its session (the lease it was created for).
    slot: Duration,
    /// The session that created it: the node ends with that session.
    session: i64,
    phase: Phase,
    /// An acquisition call returned it to the registry (as holder or waiter), which will
    /// release it or leave the queue. Until then the backend cleans it up itself.
    owned: bool,
    held: bool,
    /// While held: when the lease ends unless renewed (then the node is deleted).
    deadline: Instant,
    /// The predecessor being watched, while waiting.
    watching: Option<String>,
    watch_task: Option<AbortHandle>,
    reaper: Option<AbortHandle>,
}

enum Phase {
    /// The create is in flight (in a task of its own, so that it settles whatever happens to
    /// the caller). `abandoned`: nobody will take the node; the task deletes it when it exists.
    Creating {
        abandoned: bool,
    },
    Created {
        name: String,
        czxid: i64,
    },
}

impl Node {
    fn path(&self) -> Option<String> {
        match &self.phase {
            Phase::Created { name, .. } => Some(format!("{}/{name}", self.parent)),
            Phase::Creating { .. } => None,
        }
    }

    fn stop_tasks(&mut self) {
        if let Some(t) = self.watch_task.take() {
            t.abort();
        }
        if let Some(t) = self.reaper.take() {
            t.abort();
        }
    }
}

/// The outcome of a create: our node, and the parent's children as seen right after it.
struct Created {
    name: String,
    czxid: i64,
    children: Vec<String>,
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("hosts", &self.inner.hosts)
            .field("root", &self.inner.options.root)
            .field("auth", &self.inner.auth.as_ref().map(|_| "digest"))
            .finish()
    }
}

fn zk_err(e: zookeeper_client::Error) -> Error {
    use zookeeper_client::Error as Z;
    match e {
        Z::NoAuth | Z::AuthFailed | Z::InvalidAcl => {
            Error::backend(KIND, format!("authentication or permission failed: {e}"))
        }
        Z::ConnectionLoss
        | Z::Timeout
        | Z::NoHosts
        | Z::SessionExpired
        | Z::SessionMoved
        | Z::ClientClosed
        | Z::Throttled
        | Z::NotReadOnly => Error::unavailable(KIND, e.to_string()),
        // The client reports a failed socket (broken pipe, reset while the ensemble elects a
        // leader) as a custom error around the I/O error: transient, like a connection loss.
        Z::Custom(ref c) if is_io_error(c) => Error::unavailable(KIND, e.to_string()),
        other => Error::backend(KIND, other.to_string()),
    }
}

/// Whether `e` or one of its sources is an I/O error.
fn is_io_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<std::io::Error>().is_some() || err.to_string().contains("os error") {
            return true;
        }
        cur = err.source();
    }
    false
}

fn timed_out(what: &str, after: Duration) -> Error {
    Error::unavailable(KIND, format!("{what}: no answer within {after:?}"))
}

/// Fails unless the server granted `conn` a session timeout of exactly `lease`: the session
/// is the lease on the server (a holder that stops frees the lock when its session ends).
fn check_lease(conn: &Conn, lease: Duration) -> Result<()> {
    let granted = conn.client.session_timeout();
    if granted == conn.slot {
        return Ok(());
    }
    Err(Error::config(format!(
        "lease {lease:?}: the ZooKeeper server grants sessions of {granted:?} instead (it \
         allows only its minSessionTimeout..maxSessionTimeout, 2..20 tickTime by default); a \
         ZooKeeper lease is a session, so choose a lease within that range"
    )))
}

/// `true` for errors after which the session (and so every ephemeral node of it) is gone.
fn session_gone(e: &zookeeper_client::Error) -> bool {
    use zookeeper_client::Error as Z;
    matches!(e, Z::SessionExpired | Z::ClientClosed | Z::SessionMoved)
}

/// The token as a UUID (8-4-4-4-12 hex digits), the `<uuid>` of Curator's protected names.
fn uuid_of(token: Token) -> String {
    let v = token.as_u128();
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (v >> 96) as u32,
        (v >> 80) as u16,
        (v >> 64) as u16,
        (v >> 48) as u16,
        v & 0xffff_ffff_ffff
    )
}

/// `_c_<uuid>-`: the start of every node name of `token`.
fn protected_prefix(token: Token) -> String {
    format!("{PROTECTED}{}-", uuid_of(token))
}

/// The sequence number of a contender node (`…lock-<digits>`), as Curator sorts them.
fn sequence_of(child: &str) -> Option<i64> {
    let i = child.rfind(LOCK_NAME)?;
    let digits = &child[i + LOCK_NAME.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The lock's contenders in queue order (lowest sequence first); other children are ignored.
fn sort_contenders(children: &[String]) -> Vec<&str> {
    let mut v: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|c| sequence_of(c).map(|s| (s, c.as_str())))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, c)| c).collect()
}

/// Characters ZooKeeper refuses in a path (`PathUtils.validatePath`, on Java's UTF-16 units:
/// surrogates cover every character beyond the Basic Multilingual Plane).
fn forbidden_in_path(c: char) -> bool {
    // Rust chars are never surrogates, so U+D800..U+DFFF needs no test of its own.
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..)
}

/// Maps a key (or prefix) to one ZooKeeper path component: `/`, `%` and the characters
/// ZooKeeper forbids are percent-encoded (their UTF-8 bytes, upper-case hex), and `.` and `..`
/// become `%2E` and `%2E%2E`. Everything else is kept. Reversed by [`decode_key`].
///
/// ```
/// use distlock::backends::zookeeper::{decode_key, encode_key};
/// assert_eq!(encode_key("voucher:42"), "voucher:42");
/// assert_eq!(encode_key("a/b%c"), "a%2Fb%25c");
/// assert_eq!(encode_key(".."), "%2E%2E");
/// assert_eq!(decode_key("a%2Fb%25c").as_deref(), Some("a/b%c"));
/// ```
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c == '/' || c == '%' || forbidden_in_path(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    if out == "." || out == ".." {
        out = out.replace('.', "%2E");
    }
    out
}

/// Undoes [`encode_key`]; `None` when `component` is not valid percent-encoded UTF-8.
pub fn decode_key(component: &str) -> Option<String> {
    percent_decode(component)
}

/// `500ms`, `30s`, `2m` or plain seconds, and not zero.
fn parse_duration(param: &str, value: &str) -> Result<Duration> {
    let d = crate::url::parse_duration("zk", param, value)?;
    if d.is_zero() {
        return Err(Error::config(format!(
            "zk URL: the query parameter '{param}' must not be zero"
        )));
    }
    Ok(d)
}

/// What a `zk://` URL says.
#[derive(Debug, PartialEq, Eq)]
struct ParsedUrl {
    hosts: String,
    auth: Option<(String, String)>,
    options: ZooKeeperOptions,
}

fn parse_url(url: &str, mut options: ZooKeeperOptions) -> Result<ParsedUrl> {
    let shown = crate::redact(url);
    let err = |what: String| Error::config(format!("zk URL {shown:?}: {what}"));
    let rest = match url.split_once("://") {
        Some((scheme, rest))
            if scheme.eq_ignore_ascii_case("zk") || scheme.eq_ignore_ascii_case("zookeeper") =>
        {
            rest
        }
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("zks") => {
            return Err(err("zks:// (TLS) is not supported by this version".into()))
        }
        _ => return Err(err("expected the scheme zk://".into())),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let auth = match userinfo {
        None => None,
        Some(ui) => {
            let (user, pass) = ui
                .split_once(':')
                .ok_or_else(|| err("the password is missing (expected user:password@)".into()))?;
            let user = percent_decode(user)
                .filter(|u| !u.is_empty())
                .ok_or_else(|| err("the user name is empty or badly encoded".into()))?;
            let pass = percent_decode(pass)
                .ok_or_else(|| err("the password is badly percent-encoded".into()))?;
            Some((user, pass))
        }
    };
    if hostlist.is_empty() {
        return Err(err("the host is missing".into()));
    }
    let mut hosts = Vec::new();
    for h in hostlist.split(',') {
        if h.is_empty() {
            return Err(err("an empty host in the host list".into()));
        }
        let (host, port) = if let Some(v6) = h.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| err(format!("host {h:?}: unclosed [")))?;
            (format!("[{host}]"), after.strip_prefix(':'))
        } else {
            match h.split_once(':') {
                Some((host, port)) => (host.to_owned(), Some(port)),
                None => (h.to_owned(), None),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err(err(format!("host {h:?}: the host name is empty")));
        }
        let port =
            match port {
                None => DEFAULT_PORT,
                Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                    err(format!("host {h:?}: the port {p:?} is not a port number"))
                })?,
            };
        hosts.push(format!("{host}:{port}"));
    }
    let root = percent_decode(path).ok_or_else(|| err("the root path is badly encoded".into()))?;
    let root = root.trim_end_matches('/');
    if !root.is_empty() {
        for comp in root[1..].split('/') {
            if comp.is_empty() || comp == "." || comp == ".." || comp.chars().any(forbidden_in_path)
            {
                return Err(err(format!(
                    "the root path {root:?} is not a valid ZooKeeper path (component {comp:?})"
                )));
            }
        }
        if root == "/zookeeper" || root.starts_with("/zookeeper/") {
            return Err(err(
                "the root path /zookeeper is reserved by ZooKeeper".into()
            ));
        }
        options.root = Some(root.to_owned());
    }
    let mut insecure_auth = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "session_timeout" => options.session_timeout = parse_duration(k, v)?,
            "connect_timeout" => options.connect_timeout = parse_duration(k, v)?,
            "request_timeout" => options.request_timeout = parse_duration(k, v)?,
            "insecure_auth" => {
                insecure_auth = match v {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    _ => return Err(err(format!("insecure_auth={v:?}: expected true or false"))),
                }
            }
            other => {
                return Err(err(format!(
                    "unknown parameter {other:?} (known: session_timeout, connect_timeout, \
                     request_timeout, insecure_auth)"
                )))
            }
        }
    }
    // ZooKeeper's digest scheme sends the password itself; without TLS anybody on the path
    // reads it.
    if auth.is_some() && !insecure_auth {
        return Err(err(
            "zk:// would send the password in clear: add insecure_auth=true to send it \
             unencrypted anyway (only on a network you trust)"
                .into(),
        ));
    }
    Ok(ParsedUrl {
        hosts: hosts.join(","),
        auth,
        options,
    })
}

impl ZooKeeperBackend {
    /// Connects to the ensemble named by `url` with default options and establishes a session.
    /// Fails with [`Error::InvalidConfig`] on a malformed URL and [`Error::Unavailable`] when no
    /// server answers within the connect timeout.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ZooKeeperOptions::default()).await
    }

    /// Connects with explicit options; the URL's path and parameters override them.
    pub async fn connect_with(url: &str, options: ZooKeeperOptions) -> Result<Self> {
        let parsed = parse_url(url, options)?;
        let backend = ZooKeeperBackend {
            inner: Arc::new(Inner {
                hosts: parsed.hosts,
                auth: parsed.auth.map(|(u, p)| format!("{u}:{p}").into_bytes()),
                options: parsed.options,
                sessions: Mutex::new(HashMap::new()),
                nodes: Mutex::new(HashMap::new()),
                parents: Mutex::new(HashSet::new()),
                signals: Arc::new(ReleaseSignals::default()),
            }),
        };
        backend.inner.conn().await?;
        Ok(backend)
    }

    /// The ensemble's connect string (`host:port,host:port`).
    pub fn hosts(&self) -> &str {
        &self.inner.hosts
    }

    /// The options in force (URL parameters applied).
    pub fn options(&self) -> &ZooKeeperOptions {
        &self.inner.options
    }

    /// The session timeout the server granted.
    pub async fn session_timeout(&self) -> Result<Duration> {
        Ok(self.inner.conn().await?.client.session_timeout())
    }

    /// The parent node of `name`'s contenders: `<root>/<encoded key>`.
    pub fn lock_path(&self, name: &LockName) -> String {
        self.inner.parent_path(name)
    }

    /// The client of the current session (reconnecting when it ended), for operations this
    /// backend does not offer. Nodes it creates share the session of the locks.
    pub async fn client(&self) -> Result<Client> {
        Ok(self.inner.conn().await?.client.clone())
    }

    /// The names of `name`'s contender nodes in queue order: the holder first, then the
    /// waiters (of every client, Curator's and Spring's included). Empty when nobody holds it.
    pub async fn contenders(&self, name: &LockName) -> Result<Vec<String>> {
        let conn = self.inner.conn().await?;
        let children = self.inner.list(&conn, &self.lock_path(name)).await?;
        Ok(sort_contenders(&children)
            .into_iter()
            .map(str::to_owned)
            .collect())
    }

    /// Deletes the holder's node whoever holds it, as an operator (or a fault) would. Returns
    /// whether a holder was found. The next waiter gets the lock; the old holder learns it lost
    /// it at its next renewal.
    pub async fn force_delete(&self, name: &LockName) -> Result<bool> {
        let conn = self.inner.conn().await?;
        let parent = self.lock_path(name);
        let children = self.inner.list(&conn, &parent).await?;
        let Some(first) = sort_contenders(&children).first().map(|s| s.to_string()) else {
            return Ok(false);
        };
        match self
            .inner
            .timed(
                "delete",
                conn.client.delete(&format!("{parent}/{first}"), None),
            )
            .await?
        {
            Ok(()) => Ok(true),
            Err(zookeeper_client::Error::NoNode) => Ok(false),
            Err(e) => Err(zk_err(e)),
        }
    }
}

impl Inner {
    fn acls(&self) -> Acls<'static> {
        if self.auth.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    fn root(&self, name: &LockName) -> String {
        match &self.options.root {
            Some(r) => r.clone(),
            None => {
                let p = encode_key(name.prefix());
                // `/zookeeper` is the server's own subtree.
                if p == "zookeeper" {
                    "/%7Aookeeper".to_owned()
                } else {
                    format!("/{p}")
                }
            }
        }
    }

    fn parent_path(&self, name: &LockName) -> String {
        format!("{}/{}", self.root(name), encode_key(name.key()))
    }

    fn slot(&self, timeout: Duration) -> Arc<Slot> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(timeout)
            .or_default()
            .clone()
    }

    fn current(&self, timeout: Duration) -> Option<Arc<Conn>> {
        self.slot(timeout)
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn lock_nodes(&self) -> std::sync::MutexGuard<'_, HashMap<Token, Node>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one request with the request timeout.
    async fn timed<T>(&self, what: &str, fut: impl std::future::Future<Output = T>) -> Result<T> {
        let limit = self.options.request_timeout;
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| timed_out(what, limit))
    }

    async fn open(
        &self,
        timeout: Duration,
        resume: Option<zookeeper_client::SessionInfo>,
    ) -> std::result::Result<Client, zookeeper_client::Error> {
        let mut connector = Client::connector()
            .with_session_timeout(timeout)
            .with_fail_eagerly();
        if let Some(auth) = &self.auth {
            connector = connector.with_auth("digest", auth);
        }
        if let Some(s) = resume {
            connector = connector.with_session(s);
        }
        // Every host is tried once per round; while none serves (all down, or an ensemble
        // electing its leader) rounds repeat until the connect timeout.
        let limit = self.options.connect_timeout;
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(25);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, connector.clone().connect(&self.hosts)).await {
                Ok(Err(zookeeper_client::Error::NoHosts)) if Instant::now() + pause < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Ok(res) => return res,
                Err(_) => return Err(zookeeper_client::Error::Timeout),
            }
        }
    }

    fn connect_error(&self, e: zookeeper_client::Error) -> Error {
        let limit = self.options.connect_timeout;
        match e {
            zookeeper_client::Error::Timeout => Error::unavailable(
                KIND,
                format!("no session with {} within {limit:?}", self.hosts),
            ),
            zookeeper_client::Error::AuthFailed => {
                Error::backend(KIND, format!("authentication with {} failed", self.hosts))
            }
            e => Error::unavailable(
                KIND,
                format!("cannot establish a session with {}: {e}", self.hosts),
            ),
        }
    }

    /// The session of reads that hold nothing (`options.session_timeout`).
    async fn conn(self: &Arc<Self>) -> Result<Arc<Conn>> {
        self.conn_for(self.options.session_timeout).await
    }

    /// The current session of `timeout`, establishing a new one when it ended. A session the
    /// client gave up on (the servers were unreachable for longer than its timeout) is resumed
    /// when the ensemble still knows it, so that its nodes stay valid.
    async fn conn_for(self: &Arc<Self>, timeout: Duration) -> Result<Arc<Conn>> {
        let slot = self.slot(timeout);
        let current = || slot.conn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(c) = current() {
            if !c.client.state().is_terminated() {
                return Ok(c);
            }
        }
        let _single = slot.connecting.lock().await;
        let old = current();
        if let Some(c) = &old {
            if !c.client.state().is_terminated() {
                return Ok(c.clone());
            }
        }
        let recent_failure = *slot
            .last_connect_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if recent_failure.is_some_and(|t| t.elapsed() < Duration::from_millis(250)) {
            return Err(Error::unavailable(
                KIND,
                format!("no session with {} (retrying)", self.hosts),
            ));
        }
        let res = self.reconnect(timeout, old).await;
        if let Ok(conn) = &res {
            *slot.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        }
        *slot
            .last_connect_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = res.is_err().then(Instant::now);
        res
    }

    async fn reconnect(
        self: &Arc<Self>,
        timeout: Duration,
        old: Option<Arc<Conn>>,
    ) -> Result<Arc<Conn>> {
        let resume = old
            .as_ref()
            .filter(|c| c.client.state() == SessionState::Expired)
            .map(|c| c.client.session().clone());
        let resumed = match resume {
            Some(info) => match self.open(timeout, Some(info)).await {
                Ok(c) => Some(c),
                Err(zookeeper_client::Error::SessionExpired) => None,
                Err(e) => return Err(self.connect_error(e)),
            },
            None => None,
        };
        let client = match resumed {
            Some(c) => c,
            None => self
                .open(timeout, None)
                .await
                .map_err(|e| self.connect_error(e))?,
        };
        let conn = Arc::new(Conn {
            session: client.session_id().0,
            client,
            slot: timeout,
        });
        if let Some(old) = &old {
            if old.session != conn.session {
                tracing::warn!(
                    old = format_args!("{:#x}", old.session),
                    new = format_args!("{:#x}", conn.session),
                    "ZooKeeper session expired; every lock of the old session is lost"
                );
            }
        }
        self.watch_state(&conn);
        Ok(conn)
    }

    /// Wakes every waiter on session events: after a reconnect they check their place again,
    /// after an expiry they join the queue anew.
    fn watch_state(&self, conn: &Conn) {
        let mut states = conn.client.state_watcher();
        let signals = Arc::downgrade(&self.signals);
        tokio::spawn(async move {
            loop {
                let state = states.changed().await;
                let Some(signals) = signals.upgrade() else {
                    return;
                };
                tracing::debug!(%state, "ZooKeeper session state");
                if state != SessionState::Disconnected {
                    signals.fire_all();
                }
                if state.is_terminated() {
                    return;
                }
            }
        });
    }

    async fn list(&self, conn: &Conn, parent: &str) -> Result<Vec<String>> {
        match self
            .timed("get children", conn.client.list_children(parent))
            .await?
        {
            Ok(c) => Ok(c),
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(zk_err(e)),
        }
    }

    /// Lists children after a `sync`, so that the answer is as new as the leader's.
    async fn synced_list(&self, conn: &Conn, parent: &str) -> Result<Vec<String>> {
        let sync = conn.client.sync(parent);
        let list = conn.client.list_children(parent);
        let (synced, listed) = self
            .timed("sync and get children", async { tokio::join!(sync, list) })
            .await?;
        match synced.and(listed) {
            Ok(c) => Ok(c),
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(zk_err(e)),
        }
    }

    fn parent_known(&self, parent: &str) -> bool {
        self.parents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(parent)
    }

    fn set_parent_known(&self, parent: &str, known: bool) {
        let mut p = self.parents.lock().unwrap_or_else(|e| e.into_inner());
        if known {
            if p.len() >= MAX_KNOWN_PARENTS {
                p.clear();
            }
            p.insert(parent.to_owned());
        } else {
            p.remove(parent);
        }
    }

    /// Creates `token`'s contender node under `parent` (and the parent when missing), and lists
    /// the parent right after it in the same round trip. After a connection loss during the
    /// create, looks for the node by its protected prefix before creating again.
    async fn create_node(&self, conn: &Conn, token: Token, parent: &str) -> Result<Created> {
        let own = protected_prefix(token);
        let prefix = format!("{parent}/{own}{LOCK_NAME}");
        let acls = self.acls();
        let node_opts = CreateMode::EphemeralSequential.with_acls(acls);
        let parent_opts = CreateMode::Container.with_acls(acls);
        let client = &conn.client;
        let mut tries = 0;
        loop {
            tries += 1;
            // Requests go out in call order and the server applies a session's requests in
            // order, so the listing sees the create.
            let mk = (!self.parent_known(parent)).then(|| client.create(parent, &[], &parent_opts));
            let create = client.create(&prefix, &[], &node_opts);
            let list = client.list_children(parent);
            if let Some(mk) = mk {
                let _ = mk.await; // NodeExists is fine; any real problem shows in the create
            }
            let (created, listed) = tokio::join!(create, list);
            match created {
                Ok((stat, seq)) => {
                    self.set_parent_known(parent, true);
                    let children = match listed {
                        Ok(c) => c,
                        Err(_) => self.list_retrying(conn, parent).await?,
                    };
                    return Ok(Created {
                        name: format!("{own}{LOCK_NAME}{seq}"),
                        czxid: stat.czxid,
                        children,
                    });
                }
                Err(zookeeper_client::Error::NoNode) if tries < MAX_SETTLE => {
                    // The parent is missing (first use, or the server reaped it when empty).
                    self.set_parent_known(parent, false);
                    match client.mkdir(parent, &parent_opts).await {
                        Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                        Err(e) => return Err(zk_err(e)),
                    }
                }
                Err(zookeeper_client::Error::ConnectionLoss) if tries < MAX_SETTLE * 4 => {
                    // The create may or may not have been applied (Curator's protected mode).
                    let children = self.list_retrying(conn, parent).await?;
                    if let Some(name) = children.iter().find(|c| c.starts_with(&own)) {
                        let path = format!("{parent}/{name}");
                        match client.check_stat(&path).await {
                            Ok(Some(stat)) => {
                                return Ok(Created {
                                    name: name.clone(),
                                    czxid: stat.czxid,
                                    children,
                                })
                            }
                            Ok(None) => {} // deleted meanwhile: create again
                            Err(e) => return Err(zk_err(e)),
                        }
                    }
                }
                Err(e) => return Err(zk_err(e)),
            }
        }
    }

    /// Lists children, waiting out connection losses (the client reconnects by itself; a
    /// session that ends fails it).
    async fn list_retrying(&self, conn: &Conn, parent: &str) -> Result<Vec<String>> {
        let mut pause = Duration::from_millis(10);
        loop {
            match conn.client.list_children(parent).await {
                Ok(c) => return Ok(c),
                Err(zookeeper_client::Error::NoNode) => return Ok(Vec::new()),
                Err(zookeeper_client::Error::ConnectionLoss) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(zk_err(e)),
            }
        }
    }

    /// Starts creating `token`'s node in a task of its own: the create settles (and its node is
    /// deleted again if nobody takes it) even when the caller gives up or is cancelled.
    fn spawn_create(
        self: &Arc<Self>,
        conn: Arc<Conn>,
        token: Token,
        id: u64,
        parent: String,
    ) -> tokio::task::JoinHandle<Result<Created>> {
        let inner = self.clone();
        tokio::spawn(async move {
            let res = inner.create_node(&conn, token, &parent).await;
            let mut nodes = inner.lock_nodes();
            let taken = match nodes.get_mut(&token) {
                Some(n) if n.id != id => false,
                Some(n) if matches!(n.phase, Phase::Creating { abandoned: false }) => {
                    match &res {
                        Ok(c) => {
                            n.phase = Phase::Created {
                                name: c.name.clone(),
                                czxid: c.czxid,
                            };
                        }
                        Err(_) => {
                            nodes.remove(&token);
                        }
                    }
                    true
                }
                Some(n) if matches!(n.phase, Phase::Creating { abandoned: true }) => {
                    nodes.remove(&token);
                    false
                }
                _ => false,
            };
            drop(nodes);
            if taken {
                return res;
            }
            if let Ok(c) = &res {
                inner.delete_in_background(conn.slot, conn.session, format!("{parent}/{}", c.name));
            }
            Err(Error::unavailable(KIND, "the acquisition was abandoned"))
        })
    }

    /// Deletes a node of session `session` (of timeout `slot`), retrying until it is gone (or
    /// its session is).
    fn delete_in_background(self: &Arc<Self>, slot: Duration, session: i64, path: String) {
        let weak = Arc::downgrade(self);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the node goes with the session
        };
        rt.spawn(async move {
            let mut pause = Duration::from_millis(20);
            loop {
                let Some(inner) = weak.upgrade() else {
                    return; // the backend and its session are gone, and the node with them
                };
                if let Ok(conn) = inner.conn_for(slot).await {
                    if conn.session != session {
                        return; // the node ended with its session
                    }
                    match inner.timed("delete", conn.client.delete(&path, None)).await {
                        Ok(Ok(())) | Ok(Err(zookeeper_client::Error::NoNode)) => return,
                        Ok(Err(e)) if session_gone(&e) => return,
                        Ok(Err(e)) => {
                            tracing::debug!(%path, error = %e, "deleting a lock node failed; retrying")
                        }
                        Err(e) => tracing::debug!(%path, error = %e, "deleting a lock node timed out; retrying"),
                    }
                }
                drop(inner);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        });
    }

    /// Forgets `token`'s node (stopping its tasks) and returns it.
    fn forget(&self, token: Token) -> Option<Node> {
        let mut n = self.lock_nodes().remove(&token)?;
        n.stop_tasks();
        Some(n)
    }

    /// Deletes the node of a hold whose lease ran out unrenewed.
    fn spawn_reaper(self: &Arc<Self>, token: Token) -> AbortHandle {
        let weak: Weak<Inner> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let deadline = {
                    let Some(inner) = weak.upgrade() else { return };
                    let nodes = inner.lock_nodes();
                    match nodes.get(&token) {
                        Some(n) if n.held => n.deadline,
                        _ => return,
                    }
                };
                tokio::time::sleep_until(deadline).await;
                let Some(inner) = weak.upgrade() else { return };
                let mut nodes = inner.lock_nodes();
                let expired = match nodes.get(&token) {
                    Some(n) if n.held && n.deadline <= Instant::now() => true,
                    Some(n) if n.held => false,
                    _ => return,
                };
                if expired {
                    // Our own task: take the entry without aborting ourselves.
                    let Some(mut n) = nodes.remove(&token) else {
                        return;
                    };
                    drop(nodes);
                    n.reaper = None;
                    n.stop_tasks();
                    if let Some(path) = n.path() {
                        tracing::debug!(%path, "lease ended without renewal; giving the lock up");
                        inner.delete_in_background(n.slot, n.session, path);
                    }
                    return;
                }
            }
        })
        .abort_handle()
    }

    /// Watches `pred` (our predecessor) for deletion; the watch fires `token`'s wake-up.
    /// `false` when `pred` is already gone.
    async fn watch_predecessor(
        self: &Arc<Self>,
        conn: &Conn,
        token: Token,
        parent: &str,
        pred: &str,
    ) -> Result<bool> {
        {
            let nodes = self.lock_nodes();
            if nodes.get(&token).and_then(|n| n.watching.as_deref()) == Some(pred) {
                return Ok(true);
            }
        }
        let path = format!("{parent}/{pred}");
        let watcher = match self
            .timed("watch", conn.client.get_and_watch_data(&path))
            .await?
        {
            Ok((_, _, w)) => w,
            Err(zookeeper_client::Error::NoNode) => return Ok(false),
            Err(e) => return Err(zk_err(e)),
        };
        let signals = Arc::downgrade(&self.signals);
        let weak = Arc::downgrade(self);
        let watched = pred.to_owned();
        let task = tokio::spawn(async move {
            let event = watcher.changed().await;
            tracing::trace!(?event, "predecessor watch fired");
            if let Some(inner) = weak.upgrade() {
                if let Some(n) = inner.lock_nodes().get_mut(&token) {
                    if n.watching.as_deref() == Some(watched.as_str()) {
                        n.watching = None;
                        n.watch_task = None;
                    }
                }
            }
            if let Some(signals) = signals.upgrade() {
                signals.fire(&token.to_string());
            }
        });
        let mut nodes = self.lock_nodes();
        match nodes.get_mut(&token) {
            Some(n) => {
                if let Some(old) = n.watch_task.replace(task.abort_handle()) {
                    old.abort();
                }
                n.watching = Some(pred.to_owned());
            }
            None => task.abort(),
        }
        Ok(true)
    }

    /// One acquisition attempt; `queued` callers stay in the queue when the lock is busy.
    async fn attempt(
        self: &Arc<Self>,
        name: &LockName,
        token: Token,
        lease: Duration,
        queued: bool,
    ) -> Result<Attempt> {
        let parent = self.parent_path(name);
        let mut guard = Unowned {
            inner: self,
            token,
            armed: true,
        };
        // A connection that breaks (its server died, the ensemble is electing a leader) is
        // replaced by the client within the request timeout; an attempt is safe to repeat for
        // the same token (it finds its own node), so it is repeated until then.
        let deadline = tokio::time::Instant::now() + self.options.request_timeout;
        let mut pause = Duration::from_millis(20);
        let mut res = self.attempt_inner(&parent, token, lease, queued).await;
        while let Err(e) = &res {
            if !e.is_retryable() || tokio::time::Instant::now() + pause >= deadline {
                break;
            }
            tracing::debug!(error = %e, "attempt failed on a broken connection; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
            res = self.attempt_inner(&parent, token, lease, queued).await;
        }
        if res.is_ok() {
            guard.armed = false;
        }
        res
    }

    async fn attempt_inner(
        self: &Arc<Self>,
        parent: &str,
        token: Token,
        lease: Duration,
        queued: bool,
    ) -> Result<Attempt> {
        let slot = session_of_lease(lease);
        for _ in 0..MAX_SETTLE {
            let conn = self.conn_for(slot).await?;
            check_lease(&conn, lease)?;
            enum Have {
                Creating(tokio::task::JoinHandle<Result<Created>>),
                Known(String, i64),
            }
            let have = {
                let mut nodes = self.lock_nodes();
                if nodes.get(&token).is_some_and(|n| n.session != conn.session) {
                    // Its session ended, and the node with it.
                    if let Some(mut n) = nodes.remove(&token) {
                        n.stop_tasks();
                    }
                }
                match nodes.get_mut(&token) {
                    Some(n) => match &n.phase {
                        Phase::Creating { .. } => {
                            return Err(Error::unavailable(
                                KIND,
                                "an earlier attempt of this acquisition is still in flight",
                            ))
                        }
                        Phase::Created { name, czxid } => Have::Known(name.clone(), *czxid),
                    },
                    None => {
                        let id = NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed);
                        nodes.insert(
                            token,
                            Node {
                                id,
                                parent: parent.to_owned(),
                                slot,
                                session: conn.session,
                                phase: Phase::Creating { abandoned: false },
                                owned: false,
                                held: false,
                                deadline: Instant::now(),
                                watching: None,
                                watch_task: None,
                                reaper: None,
                            },
                        );
                        Have::Creating(self.spawn_create(
                            conn.clone(),
                            token,
                            id,
                            parent.to_owned(),
                        ))
                    }
                }
            };
            let (own, czxid, children) = match have {
                Have::Creating(task) => {
                    let created = self
                        .timed("create", task)
                        .await?
                        .map_err(|e| Error::backend(KIND, format!("create task failed: {e}")))??;
                    (created.name, created.czxid, created.children)
                }
                Have::Known(name, czxid) => {
                    // `sync` first: a server cut off from the leader cannot confirm our place.
                    let children = self.synced_list(&conn, parent).await?;
                    (name, czxid, children)
                }
            };
            let sorted = sort_contenders(&children);
            match sorted.iter().position(|c| *c == own) {
                None => {
                    // Our node is gone (deleted underneath): join the queue again.
                    self.forget(token);
                    continue;
                }
                Some(0) => {
                    let fence = u64::try_from(czxid).map_err(|_| {
                        Error::backend(KIND, format!("negative czxid {czxid} of {own}"))
                    })?;
                    let mut nodes = self.lock_nodes();
                    let n = nodes.get_mut(&token).ok_or_else(|| {
                        Error::unavailable(KIND, "the node was released meanwhile")
                    })?;
                    n.owned = true;
                    n.held = true;
                    n.deadline = Instant::now() + lease;
                    if let Some(t) = n.watch_task.take() {
                        t.abort();
                    }
                    n.watching = None;
                    drop(nodes);
                    self.install_reaper(token);
                    return Ok(Attempt::Acquired { fence });
                }
                Some(_) if !queued => {
                    // try_lock: leave at once.
                    let path = format!("{parent}/{own}");
                    match self
                        .timed("delete", conn.client.delete(&path, None))
                        .await?
                    {
                        Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                        Err(e) if session_gone(&e) => {}
                        Err(e) => return Err(zk_err(e)), // the guard deletes it in the background
                    }
                    self.forget(token);
                    return Ok(Attempt::Busy { retry_after: None });
                }
                Some(i) => {
                    let pred = sorted[i - 1].to_owned();
                    if !self.watch_predecessor(&conn, token, parent, &pred).await? {
                        continue; // the predecessor left meanwhile: look again
                    }
                    match self.lock_nodes().get_mut(&token) {
                        Some(n) => n.owned = true,
                        None => continue,
                    }
                    return Ok(Attempt::Busy { retry_after: None });
                }
            }
        }
        Err(Error::unavailable(
            KIND,
            "the lock's nodes kept changing under this attempt",
        ))
    }

    /// Starts the reaper of a node just marked held (it exits at once otherwise).
    fn install_reaper(self: &Arc<Self>, token: Token) {
        let handle = self.spawn_reaper(token);
        match self.lock_nodes().get_mut(&token) {
            Some(n) => {
                if let Some(old) = n.reaper.replace(handle) {
                    old.abort();
                }
            }
            None => handle.abort(),
        }
    }

    /// What a renewal of `token` must check: the session and the node's path. `Err(answer)`
    /// when the answer is known without asking the server (not held, or the session ended).
    fn renewal_target(
        &self,
        token: Token,
        lease: Duration,
    ) -> Result<std::result::Result<(Arc<Conn>, String), bool>> {
        let (path, slot, session) = {
            let nodes = self.lock_nodes();
            match nodes.get(&token) {
                Some(n) if n.held => match n.path() {
                    Some(p) => (p, n.slot, n.session),
                    None => return Ok(Err(false)),
                },
                _ => return Ok(Err(false)),
            }
        };
        if lease > slot {
            return Err(Error::config(format!(
                "a ZooKeeper hold lasts as long as its session: a hold taken with a lease of \
                 {slot:?} cannot be extended to {lease:?}"
            )));
        }
        Ok(match self.current(slot) {
            Some(c) if c.session == session && !c.client.state().is_terminated() => Ok((c, path)),
            _ => {
                // The client saw the session end: the node is gone.
                self.forget(token);
                Err(false)
            }
        })
    }

    /// Turns what the server said of a holder node (its ephemeral owner, `None` when it is
    /// gone) into the renewal's answer, and moves the lease's end when it is confirmed.
    fn settle_renewal(
        &self,
        conn: &Conn,
        token: Token,
        lease: Duration,
        started: Instant,
        owner: std::result::Result<Option<i64>, zookeeper_client::Error>,
    ) -> Result<bool> {
        match owner {
            Ok(Some(owner)) if owner == conn.session => {
                // The reaper may have given the lock up while the check was in flight (the
                // lease ran out meanwhile): then it is not ours any more.
                match self.lock_nodes().get_mut(&token) {
                    Some(n) if n.held => {
                        // Counted from before the request: the server heard from the session
                        // after this, so its view of the session ends later than ours.
                        n.deadline = started + lease;
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            }
            Ok(_) => {
                self.forget(token);
                Ok(false)
            }
            Err(e) if session_gone(&e) => {
                self.forget(token);
                Ok(false)
            }
            Err(e) => Err(zk_err(e)),
        }
    }

    /// Deletes `token`'s node; `Ok(Some(held))` when it was ours to delete.
    async fn remove(self: &Arc<Self>, token: Token) -> Result<Option<bool>> {
        let node = {
            let mut nodes = self.lock_nodes();
            match nodes.get_mut(&token) {
                None => return Ok(None),
                Some(n) if matches!(n.phase, Phase::Creating { .. }) => {
                    // The create task deletes it once it settles.
                    n.phase = Phase::Creating { abandoned: true };
                    n.owned = false;
                    return Ok(None);
                }
                Some(_) => {
                    let mut n = nodes.remove(&token).expect("present");
                    n.stop_tasks();
                    n
                }
            }
        };
        let path = node.path().expect("created");
        let conn = match self.conn_for(node.slot).await {
            Ok(c) => c,
            Err(e) => {
                self.delete_in_background(node.slot, node.session, path);
                return Err(e);
            }
        };
        if conn.session != node.session {
            return Ok(None); // gone with its session
        }
        match self.timed("delete", conn.client.delete(&path, None)).await {
            Ok(Ok(())) => Ok(Some(node.held)),
            Ok(Err(zookeeper_client::Error::NoNode)) => Ok(None),
            Ok(Err(e)) if session_gone(&e) => Ok(None),
            Ok(Err(e)) => {
                self.delete_in_background(node.slot, node.session, path);
                Err(zk_err(e))
            }
            Err(e) => {
                self.delete_in_background(node.slot, node.session, path);
                Err(e)
            }
        }
    }
}

/// Armed while an acquisition call runs: if it ends without handing the node to the registry
/// (an error, a timeout, cancellation), the node is deleted (now or when its create settles).
struct Unowned<'a> {
    inner: &'a Arc<Inner>,
    token: Token,
    armed: bool,
}

impl Drop for Unowned<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut nodes = self.inner.lock_nodes();
        let Some(n) = nodes.get_mut(&self.token) else {
            return;
        };
        if n.owned {
            return; // an earlier call handed it over: the registry leaves the queue
        }
        match n.phase {
            Phase::Creating { .. } => n.phase = Phase::Creating { abandoned: true },
            Phase::Created { .. } => {
                let mut n = nodes.remove(&self.token).expect("present");
                drop(nodes);
                n.stop_tasks();
                if let Some(path) = n.path() {
                    self.inner.delete_in_background(n.slot, n.session, path);
                }
            }
        }
    }
}

#[async_trait]
impl Backend for ZooKeeperBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::Monotonic,
            notifies_release: true,
            fifo: true,
            cross_process: true,
        }
    }

    /// Creates a contender node, and deletes it again unless it is the lowest.
    async fn try_acquire(&self, name: &LockName, token: Token, lease: Duration) -> Result<Attempt> {
        self.inner.attempt(name, token, lease, false).await
    }

    /// Creates a contender node on the first call for `token` (later calls reuse it), and
    /// watches its predecessor while it is not the lowest.
    async fn try_acquire_queued(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
    ) -> Result<Attempt> {
        self.inner.attempt(name, token, lease, true).await
    }

    async fn leave_queue(&self, _name: &LockName, token: Token) -> Result<()> {
        self.inner.remove(token).await.map(|_| ())
    }

    /// Deletes this token's node (only ours: the name carries the token).
    async fn release(&self, _name: &LockName, token: Token) -> Result<Released> {
        let was_held = self.inner.remove(token).await?.unwrap_or(false);
        // The queue hands the lock to the next contender: no grace period needed.
        Ok(Released {
            was_held,
            contended: false,
        })
    }

    /// The lease is the session: `true` while the session lives and the node exists.
    async fn extend(&self, _name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let inner = &self.inner;
        let (conn, path) = match inner.renewal_target(token, lease)? {
            Ok(t) => t,
            Err(answer) => return Ok(answer),
        };
        let started = Instant::now();
        // `sync` first (pipelined): a server cut off from the leader cannot answer it, so it
        // cannot confirm a session the leader may already have expired.
        let sync = conn.client.sync(&path);
        let check = conn.client.check_stat(&path);
        let (synced, checked) = inner
            .timed("sync and exists", async { tokio::join!(sync, check) })
            .await?;
        let owner = synced.and(checked).map(|s| s.map(|s| s.ephemeral_owner));
        inner.settle_renewal(&conn, token, lease, started, owner)
    }

    /// One multi-read per 256 locks (`getData` of each holder node), instead of a request each.
    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        let inner = &self.inner;
        let mut out: Vec<Option<Result<bool>>> = Vec::with_capacity(batch.len());
        let mut todo: Vec<(usize, Arc<Conn>, String)> = Vec::new();
        for (i, r) in batch.iter().enumerate() {
            match inner.renewal_target(r.token, r.lease) {
                Ok(Ok((conn, path))) => {
                    out.push(None);
                    todo.push((i, conn, path));
                }
                Ok(Err(answer)) => out.push(Some(Ok(answer))),
                Err(e) => out.push(Some(Err(e))),
            }
        }
        // One multi-read per session (holds of different leases live in different sessions).
        todo.sort_by_key(|(_, c, _)| c.session);
        let chunks: Vec<&[(usize, Arc<Conn>, String)]> = todo
            .chunk_by(|a, b| a.1.session == b.1.session)
            .flat_map(|same| same.chunks(256))
            .collect();
        for chunk in chunks {
            let conn = chunk[0].1.clone();
            let started = Instant::now();
            let mut reader = conn.client.new_multi_reader();
            let mut added = Vec::with_capacity(chunk.len());
            for (i, _, path) in chunk {
                if reader.add_get_data(path).is_ok() {
                    added.push(*i);
                } else {
                    out[*i] = Some(Ok(false));
                }
            }
            // `sync` first, pipelined, as in `extend`.
            let sync = conn.client.sync(&chunk[0].2);
            let read = reader.commit();
            let results = inner
                .timed("sync and multi-read", async {
                    let (synced, read) = tokio::join!(sync, read);
                    synced.and(read)
                })
                .await;
            match results {
                Ok(Ok(v)) if v.len() == added.len() => {
                    for (i, res) in added.into_iter().zip(v) {
                        let r = &batch[i];
                        let owner = match res {
                            zookeeper_client::MultiReadResult::Data { stat, .. } => {
                                Ok(Some(stat.ephemeral_owner))
                            }
                            zookeeper_client::MultiReadResult::Error {
                                err: zookeeper_client::Error::NoNode,
                            } => Ok(None),
                            zookeeper_client::MultiReadResult::Error { err } => Err(err),
                            _ => Ok(None),
                        };
                        out[i] =
                            Some(inner.settle_renewal(&conn, r.token, r.lease, started, owner));
                    }
                }
                Ok(Ok(_)) => {
                    for i in added {
                        out[i] = Some(Err(Error::backend(KIND, "short multi-read reply")));
                    }
                }
                Ok(Err(e)) => {
                    for i in added {
                        let r = &batch[i];
                        out[i] = Some(inner.settle_renewal(
                            &conn,
                            r.token,
                            r.lease,
                            started,
                            Err(e.clone()),
                        ));
                    }
                }
                Err(e) => {
                    for i in added {
                        out[i] = Some(Err(Error::unavailable(KIND, e.to_string())));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::backend(KIND, "renewal not answered"))))
            .collect()
    }

    async fn subscribe_waiter(
        &self,
        _name: &LockName,
        token: Token,
    ) -> Result<ReleaseSubscription> {
        let (sub, fresh) = self.inner.signals.subscribe(&token.to_string());
        if fresh {
            self.inner.signals.take_idle(1024);
        }
        Ok(sub)
    }

    /// The lowest contender's `czxid`; ZooKeeper has no lease to report.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let inner = &self.inner;
        let conn = inner.conn().await?;
        let parent = inner.parent_path(name);
        for _ in 0..MAX_SETTLE {
            let children = inner.list(&conn, &parent).await?;
            let Some(first) = sort_contenders(&children).first().map(|s| s.to_string()) else {
                return Ok(None);
            };
            match inner
                .timed(
                    "exists",
                    conn.client.check_stat(&format!("{parent}/{first}")),
                )
                .await?
            {
                Ok(Some(stat)) => {
                    return Ok(Some(LockInfo {
                        fence: u64::try_from(stat.czxid).ok(),
                        remaining: None,
                    }))
                }
                Ok(None) => continue, // released meanwhile
                Err(e) => return Err(zk_err(e)),
            }
        }
        Err(Error::unavailable(
            KIND,
            "the lock's nodes kept changing while inspecting it",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_one_reversible_component() {
        for key in [
            "voucher:42",
            "a/b",
            "/",
            "%2F",
            "a b",
            "ünï cødé ✓",
            "emoji 🦀",
            "tab\tx",
            "\u{7f}\u{85}",
            "\u{e000}private",
            ".",
            "..",
            "...",
            "zookeeper",
        ] {
            let enc = encode_key(key);
            assert!(!enc.contains('/'), "{key:?} -> {enc:?}");
            assert!(!enc.chars().any(forbidden_in_path), "{key:?} -> {enc:?}");
            assert!(enc != "." && enc != "..", "{key:?} -> {enc:?}");
            assert_eq!(decode_key(&enc).as_deref(), Some(key), "{enc:?}");
        }
        assert_eq!(encode_key("voucher:42"), "voucher:42");
        assert_eq!(encode_key("a/b"), "a%2Fb");
        assert_eq!(encode_key("🦀"), "%F0%9F%A6%80");
        assert_eq!(encode_key("..."), "...");
        assert_ne!(encode_key("a/b"), encode_key("a%2Fb"));
    }

    #[test]
    fn uuid_is_curator_shaped_and_unique_per_token() {
        let t = Token::from(0x0123_4567_89ab_cdef_0011_2233_4455_6677u128);
        assert_eq!(uuid_of(t), "01234567-89ab-cdef-0011-223344556677");
        assert_eq!(
            protected_prefix(t),
            "_c_01234567-89ab-cdef-0011-223344556677-"
        );
    }

    #[test]
    fn contenders_sort_by_sequence_like_curator() {
        let children: Vec<String> = [
            "_c_b-lock-0000000010",
            "_c_a-lock-0000000002",
            "foreign",
            "_c_c-lock-0000000003",
            "x-lock-",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            sort_contenders(&children),
            [
                "_c_a-lock-0000000002",
                "_c_c-lock-0000000003",
                "_c_b-lock-0000000010"
            ]
        );
    }

    #[test]
    fn urls_parse() {
        let p = parse_url(
            "zk://u%40x:p%3Ass@127.0.0.1:2181,[::1]:2182,zk3/SpringIntegration-LockRegistry?session_timeout=10s&request_timeout=500ms&insecure_auth=true",
            ZooKeeperOptions::default(),
        )
        .unwrap();
        assert_eq!(p.hosts, "127.0.0.1:2181,[::1]:2182,zk3:2181");
        assert_eq!(p.auth, Some(("u@x".into(), "p:ss".into())));
        assert_eq!(
            p.options.root.as_deref(),
            Some("/SpringIntegration-LockRegistry")
        );
        assert_eq!(p.options.session_timeout, Duration::from_secs(10));
        assert_eq!(p.options.request_timeout, Duration::from_millis(500));
        let p = parse_url("zk://h:1/", ZooKeeperOptions::default()).unwrap();
        assert_eq!(p.options.root, None);
        assert_eq!(p.auth, None);
        for (bad, part) in [
            ("zk://", "host"),
            ("zk://h:x", "port"),
            ("zk://h:1,,h:2", "empty host"),
            ("zk://h:1/a//b", "root path"),
            ("zk://h:1/a/..", "root path"),
            ("zk://h:1/zookeeper", "reserved"),
            ("zk://h:1?foo=1", "unknown parameter"),
            ("zk://h:1?session_timeout=soon", "session_timeout"),
            ("zk://user@h:1", "password"),
            ("redis://h:1", "scheme"),
        ] {
            let e = parse_url(bad, ZooKeeperOptions::default()).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidConfig(m) if m.contains(part)),
                "{bad}: {e}"
            );
        }
        let e = parse_url("zk://u:hunter2@h:x", ZooKeeperOptions::default()).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
