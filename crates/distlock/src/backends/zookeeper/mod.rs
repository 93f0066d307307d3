//! ZooKeeper backend: the layouts of Apache Curator's `InterProcessMutex`,
//! `InterProcessReadWriteLock` and `InterProcessSemaphoreV2`, so that Curator, Spring
//! Integration's `ZookeeperLockRegistry` and distlock exclude each other on the same path.
//!
//! | what | layout |
//! |---|---|
//! | lock of `key` | parent node `<root>/<key>`, a container node created on demand (the server reaps it when empty) |
//! | mutex contender | ephemeral sequential child `_c_<uuid>-lock-<seq>` (Curator's protected mode: the `_c_<uuid>-` prefix lets its creator find it after a connection loss during the create); distlock's `<uuid>` is the acquisition's 128-bit owner token |
//! | reader, writer | ephemeral sequential children `_c_<uuid>-__READ__<seq>`, `_c_<uuid>-__WRIT__<seq>` of the same parent (Curator's read-write lock) |
//! | holder | an exclusive contender (mutex or writer) that is first by sequence number among all three; a reader with no exclusive contender before it |
//! | semaphore permit | Curator's semaphore under the same parent: its mutex `<key>/locks/_c_<uuid>-lock-<seq>` admits one taker at a time, which creates its lease `<key>/leases/_c_<uuid>-lease-<seq>` (data `permits=<n>`, a newline, the owner description), waits until `leases` has at most `n` children, and gives the mutex back |
//! | owner | a holder's node data: distlock writes its [`Owner`](crate::Owner) description there (a waiter's node carries its liveness mark instead until it holds, see below), Curator its client's IP address by default; no data (older distlock versions) shows as unknown |
//! | election candidate | ephemeral sequential child `_c_<uuid>-latch-<seq>` of `<root>/<name>` (Curator's `LeaderLatch`), data: the candidate's description alone; the lowest sequence leads; an election and the key's lock kinds ignore each other, as `LeaderLatch` and `InterProcessMutex` do |
//! | waiting | a waiter watches only what it waits for: its predecessor, the exclusive contender before a reader, the `leases` folder; contenders are served in arrival order |
//! | fence | the holder node's `czxid` (the zxid of the transaction that created it): one sequence for the whole ensemble, so it increases per key across every kind |
//! | lease | the ZooKeeper session, sized to the lease (see below) |
//! | `<root>` | the URL's path, else `/SpringIntegration-LockRegistry` (Spring's default) with `spring=true`, else `/<prefix>` (`/lock` by default) |
//!
//! # Lock kinds on one key
//!
//! Mutex, reader and writer nodes share the parent's sequence counter, so one order covers
//! them: distlock's mutex counts Curator's readers and writers as contenders and distlock's
//! readers count `lock-` nodes as writers, so all kinds of distlock exclude each other as
//! `flock` does, and a waiting writer (or mutex) keeps later readers out. Curator's own
//! `InterProcessMutex` and `InterProcessReadWriteLock` on one path ignore each other (each
//! sorts the other's names after its own), so a Curator mutex does not wait for distlock's
//! readers and writers, nor Curator's readers and writers for distlock's mutex; only the
//! distlock side waits there. Semaphore permits and the other kinds are ordered by `czxid`: a
//! permit waits for the key's mutex, reader and writer nodes created before its lease, and
//! they wait for the leases created before them (each side creates its node, then reads the
//! other's, so of two that race the younger sees the older). A mutex or reader pays for this
//! only while the key has a `leases` folder (one more listing). Curator's semaphore does not
//! see the other kinds. Curator records no number of permits; a distlock taker whose number
//! differs from another distlock holder's is refused with [`Error::InvalidConfig`].
//!
//! # URL
//!
//! `zk://[user:password@]host:port[,host:port...][/root][?session_timeout=30s&connect_timeout=5s&request_timeout=5s&waiter_ttl=2s&allow_insecure_auth=true&spring=true]`
//!
//! `zks://[user:password@]host:port[,host:port...][/root]?ca_file=ca.pem[&cert_file=client.pem&key_file=client.key]`
//! (TLS, feature `zookeeper-tls`)
//!
//! - several hosts form one ensemble; the client moves between them on failure;
//! - `zks://` reaches every server over TLS (its `secureClientPort`) and verifies its
//!   certificate against `ca_file` (PEM, required) and the host name; `cert_file` and
//!   `key_file` (PEM) present a client certificate, for servers with `ssl.clientAuth=need`.
//!   A server whose certificate is not trusted, or that refuses the handshake, fails the
//!   connection with an [`Error::Backend`] that says which (without retrying until the connect
//!   timeout). The rustls provider is ring, installed as rustls's process default unless the
//!   application installed one (the client library asks rustls for the default);
//! - `user:password` authenticates with the `digest` scheme (`addauth digest user:password`), and
//!   every node is then created with the `CREATOR_ALL` ACL, so only clients with the same
//!   credentials can take, wait for or delete these locks; without credentials nodes are open
//!   (`OPEN_ACL_UNSAFE`, as Curator's default). The digest scheme sends the password as it is,
//!   so over plain `zk://` a URL with credentials is refused unless it also says
//!   `allow_insecure_auth=true` (use it only on a network you trust); over `zks://` the server
//!   is verified first and no opt-in is needed;
//! - the path is the root of every lock (percent-decoded), replacing the default `/<prefix>`;
//! - `spring=true`: Spring Integration's layout with Spring's defaults, so that a
//!   `ZookeeperLockRegistry` built without a root shares the locks: the root is
//!   [`SPRING_ROOT`] (`/SpringIntegration-LockRegistry`) unless the URL's path (or
//!   [`ZooKeeperOptions::root`]) gives one;
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
//! is `L` (one session per distinct lease, shared by every hold of that lease in this backend;
//! beyond eight, sessions of leases no hold uses any more are closed),
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
//! # Dead waiters
//!
//! A waiter's node lives in its lease's session. So that a waiter that dies does not block the
//! lock for its lease, a distlock waiter marks its node with an ephemeral node of a short waiter
//! session (`waiter_ttl`, 2 s, raised by the server to its `minSessionTimeout`), and the
//! distlock contender behind it deletes the node once that mark is gone: within the waiter
//! session's timeout plus a tick of the death. A waiter that holds clears the mark first; both
//! writes are conditional on the node's version, so a holder's node is never deleted. Curator's
//! waiters, and a distlock waiter that died before marking its node, keep their session bound.
//! See `waiters.rs`.
//!
//! # Fences
//!
//! The fence is the holder node's `czxid`: 64 bits, the leader epoch in the high half and a
//! counter in the low half, increasing with every transaction of the whole ensemble. Unlike the
//! sequence number, which restarts at zero when the server reaps the empty parent and a new one
//! is created, it keeps increasing per key ([`Fencing::Monotonic`](crate::Fencing::Monotonic)).
//! A server that loses its data starts counting again, so fences are not kept across data loss.
//!
//! # Round trips
//!
//! An uncontended acquisition of a mutex, reader or writer is one round trip (the create and
//! the children listing are pipelined on the session, which ZooKeeper processes in order), a
//! release one more. The first acquisition of a key in a process also pipelines the creation of
//! its parent. A semaphore permit takes three (the `locks` mutex, the lease with the listings,
//! the mutex given back), four when other holders' numbers of permits are read.

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, SessionState};

pub use zookeeper_client;

mod address;
mod attempt;
mod contender;
mod queue;
mod reap;
mod semaphore;
mod session;
mod tls;
mod view;
mod waiters;
mod watch;

use crate::backends::contenders::{self, Locked, Table};
use address::parse_url;
pub use address::{decode_key, encode_key};
use contender::{Created, Node, Phase};
use queue::sort_contenders;
use session::session_of_lease;

use crate::backend::{
    AcquireRequest, Attempt, Backend, Capabilities, ListedLock, LockInfo, LockKind, LockName,
    ReleaseSignals, ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};
use crate::url::percent_decode;

const KIND: &str = "zookeeper";
/// The root of Spring Integration's `ZookeeperLockRegistry` when it is given none (its
/// `DEFAULT_ROOT`); a `zk://` URL with `spring=true` and no path uses it.
pub const SPRING_ROOT: &str = "/SpringIntegration-LockRegistry";
/// Curator's lock name of `InterProcessMutex` (and Spring's `ZookeeperLockRegistry`).
const LOCK_NAME: &str = "lock-";
/// Curator's lock names of `InterProcessReadWriteLock`'s readers and writers.
const READ_NAME: &str = "__READ__";
const WRITE_NAME: &str = "__WRIT__";
/// Curator's lock name of `LeaderLatch`'s candidates (distlock's elections).
const LATCH_NAME: &str = "latch-";
/// Curator's `InterProcessSemaphoreV2`: the folders of its mutex and of its lease nodes under
/// the semaphore's node, and the lease nodes' name.
const GATE_DIR: &str = "locks";
const LEASE_DIR: &str = "leases";
const LEASE_NAME: &str = "lease-";
/// Curator's protected-mode prefix.
const PROTECTED: &str = "_c_";
const DEFAULT_PORT: u16 = 2181;
/// Parents known to exist that are remembered per backend before the memory is cleared.
const MAX_KNOWN_PARENTS: usize = 10_000;
/// Attempts within one acquisition call when nodes vanish under it.
const MAX_SETTLE: usize = 5;
/// Sessions of distinct leases kept open while none of their holds is left (beyond that, idle
/// ones are closed when a new lease needs a session).
const MAX_IDLE_SESSIONS: usize = 8;

/// Settings of [`ZooKeeperBackend`]; the URL's query parameters set the same fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZooKeeperOptions {
    /// Session timeout of the operations that hold nothing (default 30 s): status, listing,
    /// [`ZooKeeperBackend::client`]. Holds live in sessions sized to their lease instead (see
    /// the module docs); holds whose lease equals this share its session.
    pub session_timeout: Duration,
    /// Time allowed to establish a session (default 5 s).
    pub connect_timeout: Duration,
    /// Time allowed for one operation (default 5 s). Requests made while the connection is down
    /// wait for it to come back for at most this long, then fail as unavailable.
    pub request_timeout: Duration,
    /// Root of every lock; `None` means `/<prefix>` (`/lock` with the default prefix).
    pub root: Option<String>,
    /// Session timeout of the waiter session (default 2 s; the server raises it to its
    /// `minSessionTimeout`, 2 `tickTime` by default): a distlock waiter that dies is taken out
    /// of the queue by the distlock contender behind it about this long after its death, instead
    /// of blocking the lock for its lease (see the module docs).
    pub waiter_ttl: Duration,
}

impl Default for ZooKeeperOptions {
    fn default() -> Self {
        ZooKeeperOptions {
            session_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            root: None,
            waiter_ttl: Duration::from_secs(2),
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
    /// `zks://`: TLS to every server, verified against the URL's CA.
    tls: Option<tls::Tls>,
    options: ZooKeeperOptions,
    /// One session per session timeout: the session of reads that hold nothing
    /// (`options.session_timeout`) and one per distinct lease, sized to it.
    sessions: Mutex<HashMap<Duration, Arc<Slot>>>,
    /// This process's contender nodes by owner token, and when held ones' leases end (see
    /// `reap.rs`).
    nodes: Table<Node>,
    /// Lock parents this backend has seen exist (saves their creation on later acquisitions).
    parents: Mutex<HashSet<String>>,
    /// The waiter session's liveness marks that exist (see `waiters.rs`).
    marks: Mutex<HashSet<String>>,
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

/// One ZooKeeper session.
struct Conn {
    client: Client,
    session: i64,
    /// The session timeout asked for (the key of its [`Slot`]).
    slot: Duration,
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("hosts", &self.inner.hosts)
            .field("root", &self.inner.options.root)
            .field("auth", &self.inner.auth.as_ref().map(|_| "digest"))
            .field("tls", &self.inner.tls.is_some())
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

/// `true` for errors after which the session (and so every ephemeral node of it) is gone.
fn session_gone(e: &zookeeper_client::Error) -> bool {
    use zookeeper_client::Error as Z;
    matches!(e, Z::SessionExpired | Z::ClientClosed | Z::SessionMoved)
}

impl ZooKeeperBackend {
    /// Connects to the ensemble named by `url` with default options and establishes a session.
    /// Fails with [`Error::InvalidConfig`] on a malformed URL and [`Error::Unavailable`] when no
    /// server answers within the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ZooKeeperOptions::default()).await
    }

    /// Connects with explicit options; the URL's path and parameters override them.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect_with(url: &str, options: ZooKeeperOptions) -> Result<Self> {
        let parsed = parse_url(url, options)?;
        let tls = parsed
            .tls
            .as_ref()
            .map(|files| tls::load(files, &parsed.hosts))
            .transpose()?;
        let backend = ZooKeeperBackend {
            inner: Arc::new(Inner {
                hosts: parsed.hosts,
                auth: parsed.auth.map(|(u, p)| format!("{u}:{p}").into_bytes()),
                tls,
                options: parsed.options,
                sessions: Mutex::new(HashMap::new()),
                nodes: Table::default(),
                parents: Mutex::new(HashSet::new()),
                marks: Mutex::new(HashSet::new()),
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

    /// The session timeout the server granted to the session of
    /// [`ZooKeeperOptions::session_timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe: at most it opens the session, which a later call reuses.
    pub async fn session_timeout(&self) -> Result<Duration> {
        Ok(self.inner.conn().await?.client.session_timeout())
    }

    /// The parent node of `name`'s contenders: `<root>/<encoded key>`.
    pub fn lock_path(&self, name: &LockName) -> String {
        self.inner.parent_path(name)
    }

    /// The client of the session of [`ZooKeeperOptions::session_timeout`] (reconnecting when
    /// it ended), for operations this backend does not offer. Holds whose lease equals that
    /// timeout live in the same session; holds of other leases live in sessions of their own.
    ///
    /// # Cancel safety
    /// Cancel safe: at most it opens the session, which a later call reuses.
    pub async fn client(&self) -> Result<Client> {
        Ok(self.inner.conn().await?.client.clone())
    }

    /// The names of `name`'s contender nodes in queue order: the holder first, then the
    /// waiters (of every client, Curator's and Spring's included). Empty when nobody holds it.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn contenders(&self, name: &LockName) -> Result<Vec<String>> {
        let conn = self.inner.conn().await?;
        let children = self.inner.list(&conn, &self.lock_path(name)).await?;
        Ok(sort_contenders(&children)
            .into_iter()
            .map(|c| c.name.to_owned())
            .collect())
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

    fn root(&self, prefix: &str) -> String {
        match &self.options.root {
            Some(r) => r.clone(),
            None => {
                let p = encode_key(prefix);
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
        format!("{}/{}", self.root(name.prefix()), encode_key(name.key()))
    }

    /// What a renewal of `token` must check: the session and the node's path. `Err(answer)`
    /// when the answer is known without asking the server (not held, or the session ended).
    fn renewal_target(
        self: &Arc<Self>,
        token: Token,
        lease: Duration,
    ) -> Result<std::result::Result<(Arc<Conn>, String), bool>> {
        let (path, slot, session) = {
            let nodes = self.nodes.lock();
            match nodes.get(&token) {
                Some(n) if n.held() => match n.path() {
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
                // The client saw the session end. The ensemble may still know it (it was
                // electing a leader, which gives every session a new timeout), and `conn_for`
                // then resumes it with its nodes: delete the node, or it outlives the hold.
                self.forget_and_delete(token);
                Err(false)
            }
        })
    }

    /// Turns what the server said of a holder node (its ephemeral owner, `None` when it is
    /// gone) into the renewal's answer, and moves the lease's end when it is confirmed.
    fn settle_renewal(
        self: &Arc<Self>,
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
                match self.nodes.lock().get_mut(&token) {
                    Some(n) if n.held() => {
                        // Counted from before the request: the server heard from the session
                        // after this, so its view of the session ends later than ours.
                        n.deadline = Some(started + lease);
                        self.nodes.reap_at(token, started + lease);
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
                self.forget_and_delete(token);
                Ok(false)
            }
            Err(e) => Err(zk_err(e)),
        }
    }
}

#[async_trait]
impl Backend for ZooKeeperBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(KIND)
            .notifies_release(true)
            .fifo(true)
            .owners(true)
            .all_kinds()
    }

    /// The server's largest session timeout, when the session of
    /// [`ZooKeeperOptions::session_timeout`] was granted less than asked (the server grants at
    /// most its `maxSessionTimeout`): a hold's session is its lease.
    fn longest_lease(&self) -> Option<Duration> {
        let asked = self.inner.options.session_timeout;
        let granted = self.inner.current(asked)?.client.session_timeout();
        (granted < asked).then_some(granted)
    }

    /// Creates a contender node. A [`Try`](crate::AcquireMode::Try) attempt deletes it again
    /// unless it is the lowest; a [`Queue`](crate::AcquireMode::Queue) attempt keeps it on the
    /// first call for its token (later calls reuse it) and watches its predecessor while it is
    /// not the lowest.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.inner.attempt(request).await
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

    /// The lease is the session: `true` while the session lives and the node exists. A batch of
    /// one for [`extend_many`](Backend::extend_many).
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        crate::backends::contenders::extend_one(self, KIND, name, token, lease).await
    }

    /// One multi-read per 256 locks (`getData` of each holder node), instead of a request each;
    /// `sync` first (pipelined): a server cut off from the leader cannot answer it, so it cannot
    /// confirm a session the leader may already have expired.
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
            // `sync` first, pipelined (see above).
            let sync = conn.client.sync(&chunk[0].2);
            let read = reader.commit();
            let results = inner
                .timed("sync and multi-read", async {
                    let (synced, read) = tokio::join!(sync, read);
                    synced.and(read)
                })
                .await;
            use zookeeper_client::MultiReadResult as Read;
            let owners: Vec<_> = match results {
                Ok(Ok(v)) if v.len() == added.len() => v
                    .into_iter()
                    .map(|res| match res {
                        Read::Data { stat, .. } => Ok(Some(stat.ephemeral_owner)),
                        Read::Error {
                            err: zookeeper_client::Error::NoNode,
                        } => Ok(None),
                        Read::Error { err } => Err(err),
                        _ => Ok(None),
                    })
                    .collect(),
                Ok(Err(e)) => vec![Err(e); added.len()],
                answer => {
                    let timed_out = answer.err().map(|e| e.to_string());
                    for i in added {
                        out[i] = Some(Err(match &timed_out {
                            Some(e) => Error::unavailable(KIND, e.clone()),
                            None => Error::backend(KIND, "short multi-read reply"),
                        }));
                    }
                    continue;
                }
            };
            for (i, owner) in added.into_iter().zip(owners) {
                let r = &batch[i];
                out[i] = Some(inner.settle_renewal(&conn, r.token, r.lease, started, owner));
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::backend(KIND, "renewal not answered"))))
            .collect()
    }

    /// Fires when the waiter's predecessor goes (only the next contender is woken).
    async fn subscribe(&self, _name: &LockName, waiter: Token) -> Result<ReleaseSubscription> {
        let (sub, fresh) = self.inner.signals.subscribe(&waiter.to_string());
        if fresh {
            self.inner.signals.take_idle(1024);
        }
        Ok(sub)
    }

    /// Deletes the holders' nodes (of every kind) whoever holds the key, as an operator (or a
    /// fault) would. Returns whether a holder was found. Waiters go next; the old holders learn
    /// that they lost the lock at their next renewal.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        contenders::force_release(self, name).await
    }

    /// The holders' kind and number, the waiters, and the highest holder `czxid`; ZooKeeper
    /// has no lease to report.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        contenders::inspect(self, name).await
    }

    /// The keys under the prefix's root (`/<prefix>`, or the URL's root, which every prefix
    /// shares) that have holders.
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let conn = self.inner.conn().await?;
        self.inner.list_held(&conn, &self.inner.root(prefix)).await
    }
}
