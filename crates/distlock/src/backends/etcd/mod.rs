//! etcd backend: the layout of etcd's own `clientv3/concurrency.Mutex`, so that `etcdctl lock`,
//! the Go client's `concurrency.Mutex` and distlock exclude each other on the same names.
//!
//! | what | layout |
//! |---|---|
//! | contender | key `<prefix>/<key>/<lease id in lowercase hex>`, attached to that lease; value: the owner token (32 hex digits) |
//! | holder | the contender with the lowest create revision under `<prefix>/<key>/` |
//! | waiting | each waiter watches only the contender created just before it (FIFO, no herd) |
//! | fence | the holder key's create revision: cluster-wide, strictly increasing, the same number every etcd client sees |
//! | lease | one etcd lease per backend instance and lease length (a session, like `concurrency.Session`), kept alive in the background |
//!
//! `etcdctl lock lock/voucher:42` and `LockRegistry` with prefix `lock` on key `voucher:42`
//! contend for the same lock.
//!
//! # Sessions and leases
//!
//! etcd leases are counted in whole seconds and renewed per lease, not per key, so a backend
//! instance keeps a small pool of *session* leases: one per lease length in use (its TTL is
//! one and a half times the lock lease, rounded up to seconds, at least
//! [`EtcdOptions::min_session_ttl`]) and, when two acquisitions of one backend instance contend
//! for the same key at once (two registries sharing it), one more for the second: the key name
//! holds only the lease id, so two contenders of the same name need two leases. A background
//! task per session sends a keep-alive every fifth of its TTL; sessions idle for a minute are
//! revoked. If the process dies, its keys vanish with the session's TTL.
//!
//! The registry's per-lock lease is honoured on top of that: [`Backend::extend`] sends a
//! keep-alive of the session (so the server keeps the key for at least the lease from now) and
//! checks that the own key still exists with its create revision; a holder that stops renewing
//! has its key deleted by this backend when its lease has run out (as with Redis's `PX`). A
//! revoked or expired session, or a key deleted by someone else, makes the next renewal answer
//! `false`, and the registry reports the guard lost.
//!
//! # Waiting
//!
//! A waiter's key stays in the queue (with its create revision, its place) while it waits. The
//! waiter watches the key created just before its own, starting at the server's current
//! revision, and then checks once more that this key still exists: a watch started at an
//! older revision would be delivered by etcd 3.4's catch-up loop, which runs only every
//! 100 ms. Whenever a wait ends, the next attempt confirms in one linearizable read that the
//! own key still exists before it reports the lock acquired: the lease may have expired while
//! waiting (the bug Jepsen found in etcd 3.4.3's lock). If the own key is gone, it is created
//! again, at the back of the queue.
//!
//! # Keys
//!
//! The caller's key is used as it is, so `a/b` becomes `<prefix>/a/b/<lease>`. distlock counts
//! only direct children of `<prefix>/<key>/` as contenders, so `a` and `a/b` are distinct
//! locks; Go clients (and `etcdctl lock a`) count every key below `a/`, so they also wait
//! for holders of `a/b`, which is harmless.
//!
//! # URLs
//!
//! `etcd://[user:password@]host:port[,host:port...]`, or `etcds://…` for TLS (cargo feature
//! `etcd-tls`), with the optional query parameters `ca_file` (PEM file of the authority that
//! signed the servers' certificates; default: the Mozilla roots), `cert_file` and `key_file`
//! (a client certificate). A user name and password log in with etcd's authentication, which
//! sends the password as it is: over `etcds://` only, unless the URL adds
//! `allow_insecure_auth=true` (use that only on a network you trust); without it a password in
//! an `etcd://` URL is an [`Error::InvalidConfig`].

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::backend::{
    detached, AcquireMode, Attempt, Backend, Capabilities, Fencing, LockInfo, LockName,
    ReleaseSignal, ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};

mod address;
mod client;
mod pb;
mod session;
mod watch;

use self::address::{tls_settings, ParsedUrl};
use self::client::{is_connect_error, is_lease_not_found, map_err, Client, RpcError, Settings};
use self::pb::range_request::SortOrder;
use self::session::{run_keeper, KaCmd, Session};
use self::watch::{run_watch_hub, SubKeep, WatchHandle, WatchHub};

const KIND: &str = "etcd";
/// How many contenders one range asks for (the holder, or the predecessor, is among the first).
const PEEK: i64 = 16;
/// Keys checked by one read-only transaction when many leases are renewed at once (etcd
/// allows 128 operations per transaction by default).
const CHECK_CHUNK: usize = 100;
/// A waiter whose subscription is gone and who has not tried for this long gave up without
/// saying so: its key is deleted so that it does not hold up the queue.
const WAITER_IDLE: Duration = Duration::from_secs(30);
/// After a failed attempt the registry may have given up without knowing that the key was
/// queued: unless it tries again (or subscribes) within this time, the key is deleted.
const ORPHAN_GRACE: Duration = Duration::from_secs(3);
/// A session lease without keys for this long is revoked.
const SESSION_IDLE: Duration = Duration::from_secs(60);
/// How long a failed deletion waits before it is tried again.
const DELETE_RETRY: Duration = Duration::from_secs(1);

/// Connection and session settings of [`EtcdBackend`].
#[derive(Clone)]
pub struct EtcdOptions {
    /// Time allowed to connect (default 5 s).
    pub connect_timeout: Duration,
    /// Time allowed for one request (default 5 s).
    pub request_timeout: Duration,
    /// Shortest TTL of a session lease (default 2 s; etcd raises shorter ones to its own
    /// minimum, 1.5 × the election timeout). A process that dies holding a lock blocks
    /// others for up to its session TTL.
    pub min_session_ttl: Duration,
    /// For `etcds://`: the PEM certificate(s) of the authority that signed the servers'
    /// certificates, when it is not a public one (the URL's `ca_file` does the same).
    pub tls_ca_pem: Option<Vec<u8>>,
    /// For `etcds://`: a client certificate and its private key (PEM), for servers that
    /// require one (the URL's `cert_file` and `key_file` do the same).
    pub tls_client_identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            min_session_ttl: Duration::from_secs(2),
            tls_ca_pem: None,
            tls_client_identity_pem: None,
        }
    }
}

impl fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("min_session_ttl", &self.min_session_ttl)
            .field("tls_ca_pem", &self.tls_ca_pem.as_ref().map(|_| "…"))
            .field(
                "tls_client_identity_pem",
                &self.tls_client_identity_pem.as_ref().map(|_| "…"),
            )
            .finish()
    }
}

/// Locks on an etcd cluster (`etcd://host:port[,host:port]`, `etcds://…` for TLS).
///
/// See the [module documentation](self) for the layout and how leases map onto etcd's.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use distlock::{LockRegistry, RegistryOptions, backends::etcd::EtcdBackend};
/// let backend = EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
/// let registry = LockRegistry::with_options(backend, RegistryOptions::default())?;
/// let guard = registry.obtain("voucher:42")?.lock().await?; // key lock/voucher:42/<lease>
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct EtcdBackend {
    shared: Arc<Shared>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("servers", &self.shared.target)
            .finish()
    }
}

struct Shared {
    /// This value's own `Arc`, for the background tasks it starts.
    me: Weak<Shared>,
    client: Client,
    /// `etcd://host:port,...` without credentials, for messages.
    target: String,
    opts: EtcdOptions,
    pool: Mutex<Vec<Arc<Session>>>,
    /// Serializes lease grants, so that concurrent first acquisitions share one session.
    granting: tokio::sync::Mutex<()>,
    slots: Mutex<HashMap<Token, Arc<Slot>>>,
    watches: WatchHub,
    reaper_wake: Arc<Notify>,
    /// When the reaper looks next (ms since `epoch`).
    reaper_next_ms: AtomicU64,
    epoch: Instant,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Revoke the sessions: every key of this instance goes at once instead of with the TTL.
        for s in self.pool.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = s.cmds.send(KaCmd::Close);
        }
        self.reaper_wake.notify_one();
    }
}

/// Per-token state: one acquisition (waiting, holding, or being cleaned up).
struct Slot {
    signal: Arc<ReleaseSignal>,
    /// Alive while the registry holds the waiter's subscription.
    sub: Mutex<Weak<()>>,
    /// The predecessor watch, while subscribed.
    watch: Mutex<Option<WatchHandle>>,
    /// Shared so that an attempt can take it before its task starts (see `attempt`).
    entry: Arc<tokio::sync::Mutex<Entry>>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            signal: Arc::new(ReleaseSignal::default()),
            sub: Mutex::new(Weak::new()),
            watch: Mutex::new(None),
            entry: Arc::new(tokio::sync::Mutex::new(Entry {
                touched: Some(Instant::now()),
                ..Entry::default()
            })),
        }
    }

    fn subscribed(&self) -> bool {
        self.sub
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .strong_count()
            > 0
    }

    fn take_watch(&self) -> Option<WatchHandle> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn watches(&self, pred: &Contender) -> bool {
        self.watch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|w| {
                w.key == pred.key && w.rev == pred.rev && !w.broken.load(Ordering::Acquire)
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// No key on the server (or not known yet, see `Entry::maybe_created`).
    #[default]
    New,
    /// The key is queued behind others.
    Queued,
    /// The key is the lowest: the lock is ours.
    Held,
    /// The key must be deleted; an earlier attempt failed.
    Zombie,
    /// Nothing left on the server.
    Done,
}

#[derive(Default)]
struct Entry {
    phase: Phase,
    name: Option<LockName>,
    /// `<prefix>/<key>/`.
    dir: String,
    /// `<dir><session lease id hex>`.
    key: String,
    /// The session whose id names the key.
    session: Option<Arc<Session>>,
    /// The session the key is attached to (another one after a longer extension).
    attached: Option<Arc<Session>>,
    create_rev: i64,
    /// A create request was sent without an answer: the key may exist.
    maybe_created: bool,
    /// While held: when the registry's lease ends without renewal.
    deadline: Option<Instant>,
    /// Last call by the registry.
    touched: Option<Instant>,
    /// While a zombie: when to try deleting again.
    retry_at: Option<Instant>,
    /// The key created just before ours, as the last attempt saw it.
    pred: Option<Contender>,
    /// The last attempt failed: the registry may not know that the key is queued.
    failed_at: Option<Instant>,
}

/// One key in a lock's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Contender {
    key: Vec<u8>,
    rev: i64,
    lease: i64,
}

/// What a ranging of the queue found.
struct View {
    holder: Option<Contender>,
    pred: Option<Contender>,
}

/// The session TTL class of a lock lease: 1.5 × the lease in whole seconds, at least `min`.
fn class_of(lease: Duration, min: Duration) -> i64 {
    let want = lease.as_secs_f64() * 1.5;
    let secs = want.ceil().max(min.as_secs_f64().ceil()).max(1.0);
    secs.min(9e9) as i64
}

fn lock_dir(name: &LockName) -> String {
    let mut d = String::with_capacity(name.prefix().len() + name.key().len() + 2);
    d.push_str(name.prefix());
    d.push('/');
    d.push_str(name.key());
    d.push('/');
    d
}

fn is_direct_child(dir: &[u8], key: &[u8]) -> bool {
    key.len() > dir.len() && key.starts_with(dir) && !key[dir.len()..].contains(&b'/')
}

/// The keys directly below `dir` (not those of a lock whose key extends this one's with `/`).
fn direct_children(dir: &[u8], kvs: &[pb::KeyValue]) -> Vec<Contender> {
    kvs.iter()
        .filter(|kv| is_direct_child(dir, &kv.key))
        .map(|kv| Contender {
            key: kv.key.clone(),
            rev: kv.create_revision,
            lease: kv.lease,
        })
        .collect()
}

/// The first contenders of `dir`, oldest first.
fn ascending(dir: &str) -> pb::RangeRequest {
    pb::RangeRequest {
        limit: PEEK,
        ..pb::range_by_create(dir.as_bytes(), SortOrder::Ascend)
    }
}

/// The contenders of `dir` created before revision `rev`, youngest first.
fn before(dir: &str, rev: i64) -> pb::RangeRequest {
    pb::RangeRequest {
        limit: PEEK,
        max_create_revision: rev - 1,
        ..pb::range_by_create(dir.as_bytes(), SortOrder::Descend)
    }
}

impl EtcdBackend {
    /// Connects to the cluster named by `url` with default options. Fails with
    /// [`Error::InvalidConfig`] on a malformed URL, [`Error::Backend`] on a wrong password and
    /// [`Error::Unavailable`] when no server can be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, EtcdOptions::default()).await
    }

    /// Connects with explicit options.
    pub async fn connect_with(url: &str, options: EtcdOptions) -> Result<Self> {
        let parsed = ParsedUrl::parse(url)?;
        let tls = match parsed.tls {
            true => Some(tls_settings(&parsed, &options)?),
            false => None,
        };
        let target = format!(
            "{}://{}",
            if parsed.tls { "etcds" } else { "etcd" },
            parsed.hosts.join(",")
        );
        let unreachable = || {
            Error::unavailable(
                KIND,
                format!("cannot reach {target} within {:?}", options.connect_timeout),
            )
        };
        let failed = |e: RpcError| match e {
            RpcError::TimedOut => unreachable(),
            e if is_connect_error(&e) => unreachable(),
            e => map_err(e),
        };
        // Logging in (with a user) is a request: retried, like all, when it could not connect.
        let client = Client::connect(Settings {
            hosts: parsed.hosts.clone(),
            tls,
            user: parsed.user.clone(),
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
        })
        .await
        .map_err(failed)?;
        // One request now, so that a wrong address or password is reported by `connect`.
        client
            .status(options.connect_timeout)
            .await
            .map_err(failed)?;
        let (watch_tx, watch_rx) = mpsc::unbounded_channel();
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            watches: WatchHub { tx: watch_tx },
            client: client.clone(),
            target,
            opts: options,
            pool: Mutex::new(Vec::new()),
            granting: tokio::sync::Mutex::new(()),
            slots: Mutex::new(HashMap::new()),
            reaper_wake: Arc::new(Notify::new()),
            reaper_next_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        });
        tokio::spawn(run_watch_hub(client, watch_rx));
        tokio::spawn(run_reaper(
            Arc::downgrade(&shared),
            shared.reaper_wake.clone(),
        ));
        Ok(EtcdBackend { shared })
    }

    /// One put of `value` at `key` (no lease) through the backend's gRPC client: the
    /// baseline of the benchmark workers. Not part of the API.
    #[doc(hidden)]
    pub async fn raw_put(&self, key: &str, value: &str) -> Result<()> {
        let req = pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..pb::PutRequest::default()
        };
        self.shared.client.put(req).await.map_err(map_err)
    }

    /// One (linearizable) read of `key` through the backend's gRPC client; see
    /// [`raw_put`](Self::raw_put). Not part of the API.
    #[doc(hidden)]
    pub async fn raw_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let resp = self.shared.range(pb::range_key(key.as_bytes())).await?;
        Ok(resp.kvs.into_iter().next().map(|kv| kv.value))
    }

    async fn attempt(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
        queued: bool,
    ) -> Result<Attempt> {
        let slot = self.shared.slot_for(token);
        let shared = self.shared.clone();
        let name = name.clone();
        // In a task of its own: if the caller gives up mid-request, the outcome is still
        // recorded, and a release that follows finds it (it waits for the entry lock). The lock
        // is taken before the task starts: a release issued by a caller that gave up right
        // after this returned must not run first and let the attempt create a key nobody
        // gives back.
        let mut e = slot.entry.clone().lock_owned().await;
        detached(KIND, String::new, None, async move {
            let res = shared
                .attempt_locked(&slot, &mut e, name, token, lease, queued)
                .await;
            e.failed_at = res.is_err().then(Instant::now);
            if res.is_err() {
                shared.reap_at(Instant::now() + ORPHAN_GRACE);
            }
            res
        })
        .await
    }

    /// Deletes the key of `token` (released or given up); returns (was held, key deleted).
    async fn finish(&self, token: Token) -> Result<(bool, bool)> {
        let Some(slot) = self.shared.slot(token) else {
            return Ok((false, false));
        };
        let shared = self.shared.clone();
        detached(KIND, String::new, None, async move {
            let mut e = slot.entry.lock().await;
            shared.finish_locked(&slot, &mut e, token).await
        })
        .await
    }
}

impl Shared {
    fn slot(&self, token: Token) -> Option<Arc<Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&token)
            .cloned()
    }

    fn slot_for(&self, token: Token) -> Arc<Slot> {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(token)
            .or_insert_with(|| Arc::new(Slot::new()))
            .clone()
    }

    fn drop_slot(&self, token: Token, slot: &Arc<Slot>) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.get(&token).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(&token);
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Makes sure the reaper looks at `at` at the latest.
    fn reap_at(&self, at: Instant) {
        if self.ms(at) < self.reaper_next_ms.load(Ordering::Acquire) {
            self.reaper_wake.notify_one();
        }
    }

    async fn txn(&self, txn: pb::TxnRequest) -> Result<pb::TxnResponse> {
        self.client.txn(txn).await.map_err(map_err)
    }

    async fn range(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse> {
        self.client.range(req).await.map_err(map_err)
    }

    /// Every contender of `dir`, oldest first (for queues whose head the short ranges missed).
    async fn all_contenders(&self, dir: &str) -> Result<Vec<Contender>> {
        let resp = self
            .range(pb::range_by_create(dir.as_bytes(), SortOrder::Ascend))
            .await?;
        Ok(direct_children(dir.as_bytes(), &resp.kvs))
    }

    async fn holder(&self, dir: &str) -> Result<Option<Contender>> {
        let resp = self.range(ascending(dir)).await?;
        match direct_children(dir.as_bytes(), &resp.kvs)
            .into_iter()
            .next()
        {
            Some(c) => Ok(Some(c)),
            None if resp.more => Ok(self.all_contenders(dir).await?.into_iter().next()),
            None => Ok(None),
        }
    }

    /// The queue as seen by `mine` from an ascending range (and, when given, a range of the
    /// keys created before it), falling back to the whole queue when they missed.
    async fn view(
        &self,
        dir: &str,
        mine: &Contender,
        asc: &pb::RangeResponse,
        desc: Option<&pb::RangeResponse>,
    ) -> Result<View> {
        let d = dir.as_bytes();
        let listed = direct_children(d, &asc.kvs);
        let mut holder = listed.first().cloned();
        let mut pred = match desc {
            Some(desc) => direct_children(d, &desc.kvs).into_iter().next(),
            None => listed
                .iter()
                .take_while(|c| c.rev < mine.rev)
                .last()
                .cloned(),
        };
        let listed_mine = listed.iter().any(|c| c.rev >= mine.rev);
        let complete = holder.is_some() && (desc.is_some() || listed_mine || !asc.more);
        let desc_missed =
            desc.is_some_and(|r| pred.is_none() && r.more) && holder.as_ref() != Some(mine);
        if !complete || desc_missed {
            let all = self.all_contenders(dir).await?;
            holder = all.first().cloned();
            pred = all.iter().take_while(|c| c.rev < mine.rev).last().cloned();
        }
        Ok(View { holder, pred })
    }

    /// Picks (or grants) a session of the class of `lease` whose id no other token of this
    /// instance uses for `dir`, and registers `token` as its user for `dir`.
    async fn session_for(&self, dir: &str, token: Token, lease: Duration) -> Result<Arc<Session>> {
        let class = class_of(lease, self.opts.min_session_ttl);
        if let Some(s) = self.pick_session(dir, token, class) {
            return Ok(s);
        }
        let _granting = self.granting.lock().await;
        if let Some(s) = self.pick_session(dir, token, class) {
            return Ok(s);
        }
        let s = self.grant(class).await?;
        s.users
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dir.to_owned(), token);
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(s.clone());
        Ok(s)
    }

    fn pick_session(&self, dir: &str, token: Token, class: i64) -> Option<Arc<Session>> {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        for s in pool.iter() {
            if s.class != class || s.is_dead() {
                continue;
            }
            let mut users = s.users.lock().unwrap_or_else(|e| e.into_inner());
            if users.contains_key(dir) {
                continue;
            }
            users.insert(dir.to_owned(), token);
            return Some(s.clone());
        }
        None
    }

    /// A session of at least `class` seconds for keys that outgrew theirs (no user entry).
    async fn session_at_least(&self, class: i64) -> Result<Arc<Session>> {
        {
            let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = pool.iter().find(|s| s.class >= class && !s.is_dead()) {
                s.attached.fetch_add(1, Ordering::AcqRel);
                return Ok(s.clone());
            }
        }
        let _granting = self.granting.lock().await;
        let s = self.grant(class).await?;
        s.attached.fetch_add(1, Ordering::AcqRel);
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(s.clone());
        Ok(s)
    }

    async fn grant(&self, class: i64) -> Result<Arc<Session>> {
        let sent = Instant::now();
        let resp = self.client.lease_grant(class).await.map_err(map_err)?;
        if !resp.error.is_empty() || resp.ttl <= 0 {
            return Err(Error::backend(
                KIND,
                format!("lease grant failed: {}", resp.error),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let s = Arc::new(Session {
            id: resp.id,
            class,
            ttl: Duration::from_secs(u64::try_from(resp.ttl).unwrap_or(1)),
            dead: AtomicBool::new(false),
            users: Mutex::new(HashMap::new()),
            attached: AtomicUsize::new(0),
            idle_since: Mutex::new(None),
            confirmed: Mutex::new(sent),
            cmds: tx,
        });
        tracing::debug!(lease = %format!("{:x}", s.id), ttl = ?s.ttl, "etcd session lease granted");
        tokio::spawn(run_keeper(
            self.client.clone(),
            s.clone(),
            self.me.clone(),
            rx,
            self.opts.request_timeout,
        ));
        Ok(s)
    }

    /// A session's lease is gone (expired, revoked): forget it and wake its users, whose keys
    /// went with it.
    fn session_died(&self, s: &Arc<Session>) {
        s.dead.store(true, Ordering::Release);
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| !Arc::ptr_eq(p, s));
        let tokens: Vec<Token> = s
            .users
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .copied()
            .collect();
        tracing::debug!(lease = %format!("{:x}", s.id), keys = tokens.len(), "etcd session lease gone");
        for t in tokens {
            if let Some(slot) = self.slot(t) {
                slot.signal.fire();
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn attempt_locked(
        &self,
        slot: &Arc<Slot>,
        e: &mut Entry,
        name: LockName,
        token: Token,
        lease: Duration,
        queued: bool,
    ) -> Result<Attempt> {
        let sent = Instant::now();
        e.touched = Some(sent);
        if e.phase == Phase::Zombie {
            self.delete_own(e, token).await?;
            self.forget_key(e, token);
            e.phase = Phase::New;
        }
        if e.phase == Phase::Done {
            e.phase = Phase::New;
        }
        if e.name.is_none() {
            e.dir = lock_dir(&name);
            e.name = Some(name);
        }
        let token_hex = token.to_hex_bytes().to_vec();
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > 8 {
                // The queue keeps changing under us; the registry comes back after the next
                // notification or poll. Busy is always safe.
                return Ok(Attempt::Busy { retry_after: None });
            }
            let (mine, view) = if e.phase == Phase::New {
                if e.session.as_ref().is_none_or(|s| s.is_dead()) {
                    if let Some(old) = e.session.take() {
                        old.remove_user(&e.dir, token);
                    }
                    let s = self.session_for(&e.dir, token, lease).await?;
                    e.key = format!("{}{:x}", e.dir, s.id);
                    e.attached = Some(s.clone());
                    e.session = Some(s);
                }
                let Some(attached) = e.attached.clone() else {
                    return Err(Error::backend(KIND, "internal: no session for the key"));
                };
                let key = e.key.as_bytes();
                let txn = pb::txn(
                    vec![pb::create_revision_is(key, 0)],
                    vec![
                        pb::op_put(key, &token_hex, attached.id),
                        pb::op_range(ascending(&e.dir)),
                    ],
                    vec![
                        pb::op_range(pb::range_key(key)),
                        pb::op_range(ascending(&e.dir)),
                    ],
                );
                e.maybe_created = true;
                let resp = match self.client.txn(txn).await {
                    Ok(r) => r,
                    Err(err) if is_lease_not_found(&err) => {
                        e.maybe_created = false;
                        self.session_died(&attached);
                        continue;
                    }
                    Err(err) => return Err(map_err(err)),
                };
                let rev = if resp.succeeded {
                    resp.header.as_ref().map_or(0, |h| h.revision)
                } else {
                    let kv = pb::range_at(&resp, 0).and_then(|g| g.kvs.first());
                    match kv {
                        Some(kv) if kv.value == token_hex => kv.create_revision,
                        Some(_) => {
                            e.maybe_created = false;
                            return Err(Error::backend(
                                KIND,
                                format!(
                                    "key {} belongs to another owner (lease id collision)",
                                    e.key
                                ),
                            ));
                        }
                        // Deleted in between: try again.
                        None => continue,
                    }
                };
                e.maybe_created = false;
                e.create_rev = rev;
                e.phase = Phase::Queued;
                let mine = Contender {
                    key: e.key.clone().into_bytes(),
                    rev,
                    lease: attached.id,
                };
                let Some(asc) = pb::range_at(&resp, 1) else {
                    return Err(Error::backend(KIND, "short transaction reply"));
                };
                let view = self.view(&e.dir, &mine, asc, None).await?;
                (mine, view)
            } else {
                // Queued (or held): one linearizable read confirms the own key and ranges the
                // queue around it.
                let txn = pb::txn(
                    vec![pb::create_revision_is(e.key.as_bytes(), e.create_rev)],
                    vec![
                        pb::op_range(ascending(&e.dir)),
                        pb::op_range(before(&e.dir, e.create_rev)),
                    ],
                    vec![],
                );
                let resp = self.txn(txn).await?;
                if !resp.succeeded {
                    tracing::debug!(key = %e.key, "own key gone while waiting (lease expired or key deleted); queueing again");
                    e.phase = Phase::New;
                    e.create_rev = 0;
                    continue;
                }
                let (Some(asc), Some(desc)) = (pb::range_at(&resp, 0), pb::range_at(&resp, 1))
                else {
                    return Err(Error::backend(KIND, "short transaction reply"));
                };
                let mine = Contender {
                    key: e.key.clone().into_bytes(),
                    rev: e.create_rev,
                    lease: e.attached.as_ref().map_or(0, |s| s.id),
                };
                let view = self.view(&e.dir, &mine, asc, Some(desc)).await?;
                (mine, view)
            };

            let Some(holder) = view.holder else {
                // Our own key is always in the queue; an empty view means it just went.
                e.phase = Phase::New;
                e.create_rev = 0;
                continue;
            };
            if holder.rev == mine.rev {
                // The server keeps the key at least until the last confirmed keep-alive plus
                // the TTL; make sure that covers the lease the registry counts from `sent`.
                let Some(attached) = e.attached.clone() else {
                    return Err(Error::backend(KIND, "internal: no session for the key"));
                };
                if attached.confirmed() + attached.ttl < sent + lease {
                    match attached.keep_alive_now(self.opts.request_timeout).await? {
                        true => {}
                        false => {
                            self.session_died(&attached);
                            e.phase = Phase::New;
                            e.create_rev = 0;
                            continue;
                        }
                    }
                }
                e.phase = Phase::Held;
                let deadline = sent + lease;
                e.deadline = Some(deadline);
                if let Some(w) = slot.take_watch() {
                    self.watches.cancel(w);
                }
                self.reap_at(deadline);
                return Ok(Attempt::Acquired {
                    fence: u64::try_from(mine.rev).unwrap_or(0),
                });
            }
            if !queued {
                match self.delete_own(e, token).await {
                    Ok(_) => {
                        e.phase = Phase::Done;
                        self.forget_key(e, token);
                        if !slot.subscribed() {
                            self.drop_slot(token, slot);
                        }
                    }
                    Err(err) => {
                        self.zombify(e, err);
                    }
                }
                return Ok(Attempt::Busy { retry_after: None });
            }
            e.phase = Phase::Queued;
            e.pred = view.pred.clone();
            let Some(pred) = view.pred else {
                // The holder is older than us, so somebody precedes us; the ranges raced with
                // a change of the queue. Look again.
                continue;
            };
            if !slot.subscribed() || slot.watches(&pred) {
                return Ok(Attempt::Busy { retry_after: None });
            }
            // Watch the predecessor from now on, then look again: if it went before the watch
            // started, the next read shows it.
            self.watch_pred(slot, pred).await?;
        }
    }

    async fn watch_pred(&self, slot: &Arc<Slot>, pred: Contender) -> Result<()> {
        if let Some(old) = slot.take_watch() {
            self.watches.cancel(old);
        }
        let handle = self
            .watches
            .create(
                pred.key,
                pred.rev,
                slot.signal.clone(),
                self.opts.request_timeout,
            )
            .await?;
        *slot.watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        if !slot.subscribed() {
            if let Some(w) = slot.take_watch() {
                self.watches.cancel(w);
            }
        }
        Ok(())
    }

    /// Deletes the own key if it still holds `token`; returns whether it was there.
    async fn delete_own(&self, e: &Entry, token: Token) -> Result<bool> {
        if e.key.is_empty() {
            return Ok(false);
        }
        let key = e.key.as_bytes();
        let txn = pb::txn(
            vec![pb::value_is(key, &token.to_hex_bytes())],
            vec![pb::op_delete(key)],
            vec![],
        );
        Ok(self.txn(txn).await?.succeeded)
    }

    /// The key is gone from the server: free its name for other tokens of this instance.
    fn forget_key(&self, e: &mut Entry, token: Token) {
        let (named, attached) = (e.session.take(), e.attached.take());
        if let Some(a) = &attached {
            if named.as_ref().is_none_or(|n| !Arc::ptr_eq(a, n)) {
                a.attached.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if let Some(s) = named {
            s.remove_user(&e.dir, token);
        }
        e.maybe_created = false;
        e.create_rev = 0;
        e.deadline = None;
    }

    fn zombify(&self, e: &mut Entry, err: Error) {
        tracing::debug!(key = %e.key, error = %err, "deleting the lock key failed; retrying in the background");
        e.phase = Phase::Zombie;
        let at = Instant::now() + DELETE_RETRY;
        e.retry_at = Some(at);
        self.reap_at(at);
    }

    async fn finish_locked(
        &self,
        slot: &Arc<Slot>,
        e: &mut Entry,
        token: Token,
    ) -> Result<(bool, bool)> {
        let held = e.phase == Phase::Held;
        if let Some(w) = slot.take_watch() {
            self.watches.cancel(w);
        }
        let on_server =
            matches!(e.phase, Phase::Queued | Phase::Held | Phase::Zombie) || e.maybe_created;
        if !on_server {
            e.phase = Phase::Done;
            self.forget_key(e, token);
            self.drop_slot(token, slot);
            return Ok((held, false));
        }
        match self.delete_own(e, token).await {
            Ok(deleted) => {
                e.phase = Phase::Done;
                self.forget_key(e, token);
                self.drop_slot(token, slot);
                Ok((held, deleted))
            }
            Err(err) => {
                let msg = err.to_string();
                self.zombify(e, err);
                Err(Error::unavailable(
                    KIND,
                    format!("{msg} (the key will be deleted in the background)"),
                ))
            }
        }
    }

    /// Renews the holds of `batch` (all of this instance): one keep-alive per session and one
    /// read-only transaction per chunk of keys, all at once.
    async fn extend_batch(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        let sent = Instant::now();
        let mut out: Vec<Option<Result<bool>>> = (0..batch.len()).map(|_| None).collect();
        // (index, slot, key, create revision, session)
        let mut live = Vec::new();
        let mut longer = Vec::new();
        for (i, r) in batch.iter().enumerate() {
            let Some(slot) = self.slot(r.token) else {
                out[i] = Some(Ok(false));
                continue;
            };
            let e = slot.entry.lock().await;
            match (e.phase, e.attached.clone()) {
                (Phase::Held, Some(a)) => {
                    if class_of(r.lease, self.opts.min_session_ttl) > a.class {
                        longer.push(i);
                    } else {
                        live.push((i, slot.clone(), e.key.clone(), e.create_rev, a));
                    }
                }
                _ => out[i] = Some(Ok(false)),
            }
        }
        for i in longer {
            out[i] = Some(self.extend_one(batch[i].token, batch[i].lease).await);
        }
        let mut sessions: Vec<Arc<Session>> = Vec::new();
        let mut seen = HashSet::new();
        for (_, _, _, _, s) in &live {
            if seen.insert(s.id) {
                sessions.push(s.clone());
            }
        }
        let timeout = self.opts.request_timeout;
        let kas =
            futures_util::future::join_all(sessions.iter().map(|s| s.keep_alive_now(timeout)));
        let checks = futures_util::future::join_all(live.chunks(CHECK_CHUNK).map(|chunk| {
            let ops: Vec<pb::RequestOp> = chunk
                .iter()
                .map(|(_, _, key, _, _)| {
                    pb::op_range(pb::RangeRequest {
                        keys_only: true,
                        ..pb::range_key(key.as_bytes())
                    })
                })
                .collect();
            self.txn(pb::txn(vec![], ops, vec![]))
        }));
        let (kas, checks) = futures_util::future::join(kas, checks).await;
        let ka_of: HashMap<i64, &Result<bool>> =
            sessions.iter().map(|s| s.id).zip(kas.iter()).collect();
        for (chunk, check) in live.chunks(CHECK_CHUNK).zip(checks) {
            for (j, (i, slot, key, rev, s)) in chunk.iter().enumerate() {
                let exists = match &check {
                    Ok(resp) => Ok(pb::range_at(resp, j).is_some_and(|g| {
                        g.kvs.first().is_some_and(|kv| {
                            kv.key == key.as_bytes() && kv.create_revision == *rev
                        })
                    })),
                    Err(err) => Err(err.to_string()),
                };
                let alive = ka_of.get(&s.id).map_or(Ok(false), |r| match r {
                    Ok(b) => Ok(*b),
                    Err(e) => Err(e.to_string()),
                });
                let result = match (exists, alive) {
                    (Ok(false), _) | (_, Ok(false)) => {
                        self.key_lost(slot, *rev).await;
                        Ok(false)
                    }
                    (Ok(true), Ok(true)) => {
                        let mut e = slot.entry.lock().await;
                        if e.phase == Phase::Held && e.create_rev == *rev {
                            e.deadline = Some(sent + batch[*i].lease);
                        }
                        Ok(true)
                    }
                    (Err(m), _) | (_, Err(m)) => Err(Error::unavailable(KIND, m)),
                };
                out[*i] = Some(result);
            }
        }
        for s in &sessions {
            if matches!(ka_of.get(&s.id), Some(Ok(false))) {
                self.session_died(s);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::backend(KIND, "renewal not answered"))))
            .collect()
    }

    /// A renewal found the key gone: nothing is left on the server for this token.
    async fn key_lost(&self, slot: &Arc<Slot>, rev: i64) {
        let mut e = slot.entry.lock().await;
        if e.phase == Phase::Held && e.create_rev == rev {
            tracing::debug!(key = %e.key, "lock key gone or its lease expired");
            // The key may still exist if only the session was found dead: delete to be sure.
            e.phase = Phase::Zombie;
            e.retry_at = Some(Instant::now());
            self.reap_at(Instant::now());
        }
    }

    async fn extend_one(&self, token: Token, lease: Duration) -> Result<bool> {
        let Some(slot) = self.slot(token) else {
            return Ok(false);
        };
        let sent = Instant::now();
        let (key, rev, mut attached) = {
            let e = slot.entry.lock().await;
            match (e.phase, e.attached.clone()) {
                (Phase::Held, Some(a)) => (e.key.clone(), e.create_rev, a),
                _ => return Ok(false),
            }
        };
        let class = class_of(lease, self.opts.min_session_ttl);
        if class > attached.class {
            // The new lease outlives the session: attach the key to a longer one (its name,
            // create revision and place stay the same).
            let longer = self.session_at_least(class).await?;
            let hex = token.to_hex_bytes();
            let txn = pb::txn(
                vec![pb::value_is(key.as_bytes(), &hex)],
                vec![pb::op_put(key.as_bytes(), &hex, longer.id)],
                vec![],
            );
            let ok = match self.txn(txn).await {
                Ok(r) => r.succeeded,
                Err(err) => {
                    longer.attached.fetch_sub(1, Ordering::AcqRel);
                    return Err(err);
                }
            };
            let mut e = slot.entry.lock().await;
            if !ok || e.phase != Phase::Held || e.create_rev != rev {
                longer.attached.fetch_sub(1, Ordering::AcqRel);
                drop(e);
                self.key_lost(&slot, rev).await;
                return Ok(false);
            }
            if let Some(old) = e.attached.replace(longer.clone()) {
                if e.session.as_ref().is_some_and(|n| !Arc::ptr_eq(n, &old)) {
                    old.attached.fetch_sub(1, Ordering::AcqRel);
                }
            }
            attached = longer;
        }
        let check = pb::txn(
            vec![pb::create_revision_is(key.as_bytes(), rev)],
            vec![],
            vec![],
        );
        let (alive, exists) = futures_util::future::join(
            attached.keep_alive_now(self.opts.request_timeout),
            self.txn(check),
        )
        .await;
        let (alive, exists) = (alive?, exists?.succeeded);
        if !alive {
            self.session_died(&attached);
        }
        if !alive || !exists {
            self.key_lost(&slot, rev).await;
            return Ok(false);
        }
        let mut e = slot.entry.lock().await;
        if e.phase == Phase::Held && e.create_rev == rev {
            e.deadline = Some(sent + lease);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// One pass of the reaper: deletes keys whose holder stopped renewing, keys whose waiter
    /// vanished and keys an earlier deletion failed to remove. Returns when to look again.
    async fn reap(&self) -> Instant {
        let now = Instant::now();
        let mut next = now + Duration::from_secs(5);
        let slots: Vec<(Token, Arc<Slot>)> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(t, s)| (*t, s.clone()))
            .collect();
        for (token, slot) in slots {
            let Ok(mut e) = slot.entry.try_lock() else {
                next = next.min(now + Duration::from_millis(200));
                continue;
            };
            let idle_since = e.touched.map(|t| t + WAITER_IDLE);
            // The last attempt failed and nothing happened since: the registry may have given
            // up on a key it does not know about.
            let orphan_at = e
                .failed_at
                .filter(|f| e.touched.is_none_or(|t| t <= *f))
                .map(|f| f + ORPHAN_GRACE);
            let on_server = matches!(e.phase, Phase::Queued) || e.maybe_created;
            if on_server && !slot.subscribed() {
                if let Some(t) = orphan_at.filter(|t| *t > now) {
                    next = next.min(t);
                }
            }
            let orphaned = on_server
                && e.phase != Phase::Held
                && !slot.subscribed()
                && orphan_at.is_some_and(|t| t <= now);
            let delete = orphaned
                || match e.phase {
                    Phase::Held => match e.deadline {
                        Some(d) if d <= now => {
                            tracing::debug!(key = %e.key, "lease ended without renewal; deleting the lock key");
                            true
                        }
                        Some(d) => {
                            next = next.min(d);
                            false
                        }
                        None => false,
                    },
                    Phase::Queued if !slot.subscribed() => match idle_since {
                        Some(t) if t <= now => true,
                        Some(t) => {
                            next = next.min(t);
                            false
                        }
                        None => true,
                    },
                    Phase::Zombie => match e.retry_at {
                        Some(t) if t > now => {
                            next = next.min(t);
                            false
                        }
                        _ => true,
                    },
                    Phase::New if e.maybe_created && idle_since.is_none_or(|t| t <= now) => true,
                    Phase::New | Phase::Done if !slot.subscribed() => {
                        if idle_since.is_none_or(|t| t <= now) {
                            self.drop_slot(token, &slot);
                        } else if let Some(t) = idle_since {
                            next = next.min(t);
                        }
                        false
                    }
                    _ => false,
                };
            if delete {
                if let Some(w) = slot.take_watch() {
                    self.watches.cancel(w);
                }
                match self.delete_own(&e, token).await {
                    Ok(_) => {
                        e.phase = Phase::Done;
                        self.forget_key(&mut e, token);
                        self.drop_slot(token, &slot);
                    }
                    Err(err) => {
                        self.zombify(&mut e, err);
                        next = next.min(now + DELETE_RETRY);
                    }
                }
            }
        }
        next
    }
}

async fn run_reaper(weak: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        shared.reaper_next_ms.store(u64::MAX, Ordering::Release);
        let next = shared.reap().await;
        shared
            .reaper_next_ms
            .store(shared.ms(next), Ordering::Release);
        drop(shared);
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

#[async_trait]
impl Backend for EtcdBackend {
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

    /// Puts the token's key under the lock's prefix. [`AcquireMode::Try`] deletes it again
    /// unless it has the lowest create revision; [`AcquireMode::Queue`] keeps it as the
    /// token's place in line.
    async fn acquire(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
        mode: AcquireMode,
    ) -> Result<Attempt> {
        self.attempt(name, token, lease, mode == AcquireMode::Queue)
            .await
    }

    async fn leave_queue(&self, _name: &LockName, token: Token) -> Result<()> {
        self.finish(token).await.map(|_| ())
    }

    async fn release(&self, _name: &LockName, token: Token) -> Result<Released> {
        let (held, deleted) = self.finish(token).await?;
        Ok(Released {
            was_held: held && deleted,
            // The queue is fair already: waiters keep their places.
            contended: false,
        })
    }

    async fn extend(&self, _name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        self.shared.extend_one(token, lease).await
    }

    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        if batch.len() == 1 {
            return vec![self.shared.extend_one(batch[0].token, batch[0].lease).await];
        }
        self.shared.extend_batch(batch).await
    }

    /// Fires when the waiter's predecessor key goes (only the next contender is woken).
    async fn subscribe(&self, _name: &LockName, waiter: Token) -> Result<ReleaseSubscription> {
        let token = waiter;
        let slot = self.shared.slot_for(token);
        let alive = Arc::new(());
        *slot.sub.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&alive);
        let sub = ReleaseSubscription::new(
            slot.signal.clone(),
            Some(Box::new(SubKeep {
                _alive: alive,
                slot: Arc::downgrade(&slot),
                hub: self.shared.watches.tx.clone(),
            })),
        );
        // Watch the known predecessor now; the registry looks again right after.
        let shared = self.shared.clone();
        detached(KIND, String::new, None, async move {
            let mut e = slot.entry.lock().await;
            e.touched = Some(Instant::now());
            if e.phase != Phase::Queued {
                return Ok(());
            }
            let Some(pred) = e.pred.clone() else {
                return Ok(());
            };
            if !slot.watches(&pred) {
                shared.watch_pred(&slot, pred).await?;
            }
            Ok(())
        })
        .await?;
        Ok(sub)
    }

    /// Deletes the current holder's key of `name`, whoever holds it, as an operator (or a
    /// fault) would. Returns whether there was one.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let s = &self.shared;
        let dir = lock_dir(name);
        let Some(holder) = s.holder(&dir).await? else {
            return Ok(false);
        };
        let txn = pb::txn(
            vec![pb::create_revision_is(&holder.key, holder.rev)],
            vec![pb::op_delete(&holder.key)],
            vec![],
        );
        Ok(s.txn(txn).await?.succeeded)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let s = &self.shared;
        let Some(holder) = s.holder(&lock_dir(name)).await? else {
            return Ok(None);
        };
        let mut remaining = None;
        if holder.lease != 0 {
            if let Ok(r) = s.client.lease_time_to_live(holder.lease).await {
                remaining = u64::try_from(r.ttl).ok().map(Duration::from_secs);
            }
        }
        Ok(Some(LockInfo {
            fence: u64::try_from(holder.rev).ok(),
            remaining,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_classes() {
        let min = Duration::from_secs(2);
        assert_eq!(class_of(Duration::from_millis(300), min), 2);
        assert_eq!(class_of(Duration::from_secs(2), min), 3);
        assert_eq!(class_of(Duration::from_secs(30), min), 45);
        assert_eq!(class_of(Duration::from_millis(10), Duration::ZERO), 1);
    }

    #[test]
    fn only_direct_children_contend() {
        let dir = b"lock/a/";
        assert!(is_direct_child(dir, b"lock/a/1f"));
        assert!(!is_direct_child(dir, b"lock/a/b/2f"));
        assert!(!is_direct_child(dir, b"lock/a/"));
        assert!(!is_direct_child(dir, b"lock/ab"));
    }
}
