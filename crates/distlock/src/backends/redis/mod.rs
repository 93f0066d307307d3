//! Redis backend, single node: the layout of Spring Integration's `RedisLockRegistry`, so that
//! Java services and distlock exclude each other on the same keys.
//!
//! | what | layout |
//! |---|---|
//! | lock | STRING `<prefix>:<key>` holding the owner token, with a `PX` lease; taken by `SET NX PX` |
//! | acquire | `SET NX PX` pipelined with a script that takes the fence if the `SET` won (a script once waiters queue) |
//! | release | compare-and-delete script that hands the lock to the first queued distlock waiter, or deletes it and publishes `<prefix>:<key>` on `<prefix>-channel:<prefix>:<key>` (and, if asked, `<prefix>-channel`) |
//! | fence | counter in the lock key's hash slot, seeded from the server's clock in µs |
//! | wait queue | ZSET + HASH in the lock key's hash slot: FIFO order and each waiter's expiry and kind |
//! | read-write lock | Redisson's `RReadWriteLock` hash at `<prefix>:<key>` (`mode` = `read`/`write`, a field per holder, a timeout key per reader, channel `redisson_rwlock:{<prefix>:<key>}`), see `kinds.rs` |
//! | semaphore | a hash at `<prefix>:<key>`: `mode` = `semaphore`, `permits` = N, a field per permit with its expiry in server time |
//!
//! Any client of the common `SET key token NX PX` protocol (Spring, redis-py's `Lock`,
//! redsync) is excluded by and excludes distlock, whatever kind holds the key; Redisson's
//! read and write locks share the read-write lock with ours. Because the fence counter restarts from the
//! server's clock whenever it is missing, it keeps increasing after a restart that lost all
//! data (as long as the server's clock does not step back).
//!
//! Plain `redis://` connections use a small built-in RESP client on the lock path;
//! `rediss://` (TLS) goes through the `redis` crate. Pub/sub always uses the `redis` crate.
//! Sentinel (`sentinel.rs`) and Cluster (`cluster.rs`) reuse all of this and only decide
//! which node a request goes to.

mod cluster;
mod keys;
mod kind_scripts;
mod kinds;
mod mutex;
mod notify;
pub mod redlock;
mod replicas;
mod resp;
mod scripts;
mod sentinel;
#[cfg(test)]
mod tests;
mod transport;

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use self::keys::{reader_prefix, sibling_key};
use self::kinds::{disagreement, letter, KindAttempt};
use self::notify::{Contended, Grants, Left, PubSub};
use self::resp::{ConnInfo, Pool, Reply};
use self::scripts::{Lua, Scripts};
use self::transport::{refuse_clear_password, server_err};

use crate::backend::{
    AcquireRequest, Attempt, Backend, Capabilities, Fencing, ListedLock, LockInfo, LockKind,
    LockName, ReleaseSignals, ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};

const KIND: &str = "redis";

/// Locks renewed by one script call: big enough that a batch costs few calls, small enough
/// that one call does not hold up the server (it runs alone while it runs).
const RENEW_CHUNK: usize = 256;

/// Connection settings of [`RedisBackend`].
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// Time allowed to establish a connection (default 5 s).
    pub connect_timeout: Duration,
    /// Time allowed for one reply (default 5 s).
    pub response_timeout: Duration,
    /// How long a waiter keeps its place in a lock's wait queue without renewing it (default
    /// 2 s). Waiters renew it with every attempt, at least every 500 ms by default; a waiter
    /// that crashed holds up the queue for at most this long. A release that hands the lock to
    /// the head of the queue grants it only for what is left of the head's place (or the
    /// head's lease, if shorter; a longer lease the head claims with its next attempt), so a
    /// lock handed to a waiter that died is free again within this time too.
    pub waiter_ttl: Duration,
    /// For `rediss://`: the PEM certificate(s) of the authority that signed the server's
    /// certificate, when it is not in the system's trust store (a private CA).
    pub tls_root_cert_pem: Option<Vec<u8>>,
    /// Also publish a release on `<prefix>-channel`, where Spring Integration up to 6.5.2
    /// listens (default false). Releases are always published on
    /// `<prefix>-channel:<prefix>:<key>`, where later versions listen; the second message
    /// costs the server about 5% more per lock cycle.
    pub spring_legacy_channel: bool,
    /// Send a password over plain TCP (`redis://`), where anyone on the path can read it
    /// (default false: a URL with a password needs `rediss://`, or this set, by
    /// `allow_insecure_auth=true` in the URL). Use it only on a network you trust.
    pub allow_insecure_auth: bool,
    /// How long a backend that got a contended lock may keep taking it back when it releases
    /// and acquires again at once (default zero, off: every release hands the lock to the
    /// head of the queue). Within its slice such a release leaves the key reserved for this
    /// backend's next acquisition; the waiters queued keep their order and are served when the
    /// slice ends, or when the reservation runs out unused. This is what makes a key that
    /// several processes take in a tight loop run at nearly the speed of an uncontended one
    /// and still give each its share: a strict hand-over at every release costs two process
    /// switches and a dozen server calls per cycle. Go's `sync.Mutex` makes the same trade
    /// the other way round (barging until a waiter has waited 1 ms). At most half of
    /// `waiter_ttl`. URL: `hold_slice=5ms`.
    ///
    /// Opt-in, because a reservation is invisible to clients outside the queue: a plain
    /// `SET NX` client (Spring, redis-py), and a distlock `try_lock`, find a released key busy
    /// for the rest of the slice plus `waiter_ttl`, also when the looping program stopped.
    pub hold_slice: Duration,
    /// The most connections a `redis://` backend opens to its server at once (default 32, at
    /// most [`MAX_CONNECTIONS`]). Each lock call takes a free connection and writes its
    /// request at once; a call that finds all of them in use waits in line, and the calls
    /// waiting there go out together, in one write, on the next connection that comes free.
    /// A process that makes many lock calls at once (a service in front of many clients) can
    /// set it low, so that its calls share writes and reads instead of each paying its own
    /// system calls, on the client and on the server. URL: `max_connections=4`. Not used by
    /// `rediss://`, whose lock calls share one multiplexed connection.
    pub max_connections: usize,
}

/// The largest [`RedisOptions::max_connections`].
pub const MAX_CONNECTIONS: usize = 1024;

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            waiter_ttl: Duration::from_secs(2),
            tls_root_cert_pem: None,
            spring_legacy_channel: false,
            allow_insecure_auth: false,
            hold_slice: Duration::ZERO,
            max_connections: resp::MAX_OPEN,
        }
    }
}

/// Locks on one Redis server (`redis://[user:pass@]host:port[/db]`, or `rediss://` for TLS),
/// on the master that Sentinels name (`redis+sentinel://…/MASTER`), or on the master of each
/// lock's hash slot in a Redis Cluster (`redis+cluster://host:port[,host:port]`): the same
/// layout and scripts in each, see [`connect`](crate::connect) for the URLs.
pub struct RedisBackend {
    client: redis::Client,
    target: String,
    config: AsyncConnectionConfig,
    /// The lock path's connections: the built-in client for plain TCP, else the `redis` crate.
    pool: Option<Arc<Pool>>,
    conn: Mutex<Option<MultiplexedConnection>>,
    scripts: Scripts,
    signals: Arc<ReleaseSignals>,
    grants: Arc<Grants>,
    /// Lock keys seen waited for (see [`Contended`]).
    contended: Contended,
    pubsub: tokio::sync::Mutex<PubSub>,
    /// Set when the pub/sub connection dropped or a failover moved the master: the next
    /// attempt subscribes every channel again, on a node that serves now.
    relisten: Arc<AtomicBool>,
    waiter_ttl_ms: u64,
    spring_legacy_channel: bool,
    /// Replicas that must acknowledge an acquisition or extension (`WAIT`), 0 for none.
    replicas: Arc<replicas::Replicas>,
    replica_timeout_ms: u64,
    /// With Sentinel: how to reach the current master's pub/sub.
    sentinel: Option<sentinel::Mode>,
    /// With Redis Cluster: the slot map and a pool per node, instead of `pool`.
    cluster: Option<cluster::Cluster>,
    /// Names this backend instance's wake channel: queued waiters are woken one at a time.
    instance: String,
    /// See [`RedisOptions::hold_slice`].
    hold_slice: Duration,
    /// What a release within this backend's slice leaves at the key: `~<instance>:<grace ms>`.
    reservation: String,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.target)
            .finish()
    }
}

/// A duration in whole milliseconds for `PX`/`PEXPIRE`, rounded up: a lease is never sent
/// shorter than asked, and never as zero.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

impl RedisBackend {
    /// Connects to the server named by `url` with default options. Fails with
    /// [`Error::InvalidConfig`] on a malformed URL, [`Error::Backend`] on a wrong password and
    /// [`Error::Unavailable`] when the server cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    ///
    /// The URL's query may say `spring_legacy_channel=true` (see
    /// [`RedisOptions::spring_legacy_channel`]), `allow_insecure_auth=true` (see
    /// [`RedisOptions::allow_insecure_auth`]; without it a password needs `rediss://`) and
    /// `hold_slice=5ms` (see [`RedisOptions::hold_slice`]) and, on `redis://`,
    /// `max_connections=4` (see [`RedisOptions::max_connections`]); the rest of it goes to the
    /// `redis` crate.
    /// `redis+sentinel://` and `redis+cluster://` URLs take `min_replicas` and
    /// `replica_timeout` (replicas that must acknowledge an acquisition or extension with
    /// `WAIT`, default 1 when the masters have replicas; how long `WAIT` may take, default 1 s).
    pub async fn connect(url: &str) -> Result<Self> {
        if url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://") {
            return sentinel::connect(url, RedisOptions::default()).await;
        }
        if url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://") {
            return cluster::connect(url, RedisOptions::default()).await;
        }
        let mut options = RedisOptions::default();
        let url = match url.split_once('?') {
            Some((base, query)) => {
                let mut rest = Vec::new();
                for pair in query.split('&') {
                    match pair.split_once('=') {
                        Some(("spring_legacy_channel", v)) => {
                            options.spring_legacy_channel =
                                crate::url::parse_bool(KIND, "spring_legacy_channel", v)?;
                        }
                        Some(("allow_insecure_auth", v)) => {
                            options.allow_insecure_auth =
                                crate::url::parse_bool(KIND, "allow_insecure_auth", v)?;
                        }
                        Some(("hold_slice", v)) => {
                            options.hold_slice = crate::url::parse_duration(KIND, "hold_slice", v)?;
                        }
                        Some(("max_connections", v)) => {
                            options.max_connections = transport::parse_max_connections(base, v)?;
                        }
                        _ => rest.push(pair),
                    }
                }
                if rest.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", rest.join("&"))
                }
            }
            None => url.to_owned(),
        };
        Self::connect_with(&url, options).await
    }

    /// Connects with explicit options.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        let backend = Self::build(url, options)?;
        backend.ping().await?;
        Ok(backend)
    }

    /// Answers whether the server is reachable and accepts the credentials.
    async fn ping(&self) -> Result<()> {
        match self.command(vec![b"PING".to_vec()]).await? {
            Reply::Error(e) => Err(server_err(e)),
            _ => Ok(()),
        }
    }

    /// The backend for `url`, without connecting yet.
    fn build(url: &str, options: RedisOptions) -> Result<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|e| Error::config(format!("redis URL {:?}: {e}", crate::redact(url))))?;
        match parsed.scheme() {
            "redis" | "rediss" => {}
            s => {
                return Err(Error::config(format!(
                    "redis URL scheme {s:?}: expected redis or rediss"
                )))
            }
        }
        if options.hold_slice > options.waiter_ttl / 2 {
            return Err(Error::config(format!(
                "redis hold_slice {:?} is longer than half the waiter ttl {:?}",
                options.hold_slice, options.waiter_ttl
            )));
        }
        if options.max_connections == 0 || options.max_connections > MAX_CONNECTIONS {
            return Err(Error::config(format!(
                "redis max_connections {}: expected 1 to {MAX_CONNECTIONS}",
                options.max_connections
            )));
        }
        let host = parsed.host_str().unwrap_or("");
        if host.is_empty() {
            return Err(Error::config(format!(
                "redis URL {:?}: the host is missing",
                crate::redact(url)
            )));
        }
        refuse_clear_password(
            &format!("redis URL {:?}", crate::redact(url)),
            parsed.scheme() == "rediss",
            parsed.password().is_some_and(|p| !p.is_empty()),
            options.allow_insecure_auth,
        )?;
        let path = parsed.path().trim_start_matches('/');
        if !path.is_empty() && path.parse::<u16>().is_err() {
            return Err(Error::config(format!(
                "redis URL {:?}: the database {path:?} is not a number",
                crate::redact(url)
            )));
        }
        // With `zookeeper-tls` rustls has two providers, and `redis` builds its TLS
        // configuration with the process default.
        #[cfg(feature = "zookeeper-tls")]
        if parsed.scheme() == "rediss" {
            crate::tls::ensure_default_provider();
        }
        let client = match &options.tls_root_cert_pem {
            Some(pem) if parsed.scheme() == "rediss" => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            _ => redis::Client::open(url),
        }
        .map_err(|e| Error::config(format!("redis URL {:?}: {e}", crate::redact(url))))?;
        let target = format!(
            "{}://{}:{}/{}",
            parsed.scheme(),
            host,
            parsed.port().unwrap_or(6379),
            path
        );
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout));
        // As the `redis` crate decodes them for its own connections (a `+` stays a `+`).
        let decode = crate::url::percent_decode_lenient;
        let pool = (parsed.scheme() == "redis").then(|| {
            Arc::new(
                Pool::new(ConnInfo {
                    addr: format!(
                        "{}:{}",
                        host.trim_matches(['[', ']']),
                        parsed.port().unwrap_or(6379)
                    ),
                    user: Some(decode(parsed.username())).filter(|u| !u.is_empty()),
                    password: parsed.password().map(decode),
                    db: path.parse().unwrap_or(0),
                    connect_timeout: options.connect_timeout,
                    response_timeout: options.response_timeout,
                    sentinel: None,
                    node_id: None,
                    tls: None,
                })
                .with_max_open(options.max_connections),
            )
        });
        let instance = format!("{:016x}", rand::random::<u64>());
        Ok(RedisBackend {
            client,
            target,
            config,
            pool,
            conn: Mutex::new(None),
            scripts: Scripts::new(false),
            signals: Arc::new(ReleaseSignals::default()),
            grants: Arc::default(),
            contended: Contended::default(),
            pubsub: tokio::sync::Mutex::new(PubSub::default()),
            relisten: Arc::default(),
            waiter_ttl_ms: ms(options.waiter_ttl),
            spring_legacy_channel: options.spring_legacy_channel,
            replicas: Arc::default(),
            replica_timeout_ms: 1000,
            sentinel: None,
            cluster: None,
            hold_slice: options.hold_slice,
            reservation: format!("~{instance}:{}", ms(options.waiter_ttl)),
            instance,
        })
    }

    /// How many wake-up channels this backend keeps track of (lock keys listened to, waiters'
    /// own channels): for tests that check the table stays bounded.
    #[doc(hidden)]
    pub fn wake_channels(&self) -> usize {
        self.signals.len()
    }

    fn lock_key(name: &LockName) -> String {
        let mut k = String::with_capacity(name.prefix().len() + name.key().len() + 1);
        k.push_str(name.prefix());
        k.push(':');
        k.push_str(name.key());
        k
    }

    /// The scripts' flag for also publishing on the legacy Spring channel.
    fn legacy(&self) -> &'static [u8] {
        if self.spring_legacy_channel {
            b"1"
        } else {
            b"0"
        }
    }

    fn channel(name: &LockName) -> String {
        format!("{}-channel", name.prefix())
    }

    /// `<prefix>-wake:`; an instance's own wake channel appends its id.
    fn wake_prefix(name: &LockName) -> String {
        format!("{}-wake:", name.prefix())
    }

    fn member(&self, token: Token) -> Vec<u8> {
        let mut m = Vec::with_capacity(33 + self.instance.len());
        m.extend_from_slice(&token.to_hex_bytes());
        m.push(b':');
        m.extend_from_slice(self.instance.as_bytes());
        m
    }

    /// Renews `batch` on one node: one script call per chunk of [`RENEW_CHUNK`] holds of a
    /// kind (`EXTEND_MANY` for mutex holds, `KIND_EXTEND` for the others), all chunks in one
    /// pipeline (on Redis Cluster, the holds of one hash slot).
    async fn extend_batch(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        if batch.len() == 1 {
            return vec![
                self.extend(&batch[0].name, batch[0].token, batch[0].lease)
                    .await,
            ];
        }
        // One script call per chunk of locks, all chunks in one pipeline: the server runs a
        // loop instead of parsing and dispatching a command per lock. Mutex holds and the
        // other kinds have a script each.
        let (mutex, others): (Vec<usize>, Vec<usize>) =
            (0..batch.len()).partition(|&i| batch[i].name.kind() == LockKind::Mutex);
        let keys: Vec<String> = batch.iter().map(|r| Self::lock_key(&r.name)).collect();
        let owners: Vec<String> = keys.iter().map(|k| sibling_key(k, "owners")).collect();
        let cluster = self.cluster.is_some();
        let prefixes: Vec<String> = others
            .iter()
            .map(|&i| reader_prefix(&keys[i], cluster))
            .collect();
        let tokens: Vec<[u8; 32]> = batch.iter().map(|r| r.token.to_hex_bytes()).collect();
        let leases: Vec<String> = batch.iter().map(|r| ms(r.lease).to_string()).collect();
        let mut calls: Vec<(&Lua, Vec<&[u8]>, usize)> = Vec::new();
        let mut spans: Vec<&[usize]> = Vec::new();
        for chunk in mutex.chunks(RENEW_CHUNK) {
            let mut rest: Vec<&[u8]> = Vec::with_capacity(4 * chunk.len());
            for &i in chunk {
                rest.extend([keys[i].as_bytes(), owners[i].as_bytes()]);
            }
            for &i in chunk {
                rest.extend([tokens[i].as_slice(), leases[i].as_bytes()]);
            }
            calls.push((&self.scripts.extend_many, rest, 2 * chunk.len()));
            spans.push(chunk);
        }
        for (chunk, prefixes) in others.chunks(RENEW_CHUNK).zip(prefixes.chunks(RENEW_CHUNK)) {
            let mut rest: Vec<&[u8]> = Vec::with_capacity(6 * chunk.len());
            for (&i, prefix) in chunk.iter().zip(prefixes) {
                rest.extend([keys[i].as_bytes(), prefix.as_bytes(), owners[i].as_bytes()]);
            }
            for &i in chunk {
                rest.extend([
                    tokens[i].as_slice(),
                    leases[i].as_bytes(),
                    letter(batch[i].name.kind()),
                ]);
            }
            calls.push((&self.scripts.kind_extend, rest, 3 * chunk.len()));
            spans.push(chunk);
        }
        let replies = match self.eval_pipeline(&calls, true).await {
            Ok(replies) => replies,
            Err(e) => {
                let (msg, retry) = (e.to_string(), e.is_retryable());
                return batch
                    .iter()
                    .map(|_| {
                        Err(if retry {
                            Error::unavailable(KIND, msg.clone())
                        } else {
                            Error::backend(KIND, msg.clone())
                        })
                    })
                    .collect();
            }
        };
        let mut out: Vec<Option<Result<bool>>> = (0..batch.len()).map(|_| None).collect();
        for (reply, chunk) in replies.into_iter().zip(spans) {
            match reply {
                Reply::Array(Some(items)) if items.len() == chunk.len() => {
                    for (item, &i) in items.iter().zip(chunk) {
                        out[i] = Some(Ok(item.int().is_some_and(|n| n > 0)));
                    }
                }
                Reply::Error(e) => {
                    for &i in chunk {
                        out[i] = Some(Err(server_err(e.clone())));
                    }
                }
                r => {
                    for &i in chunk {
                        out[i] = Some(Err(Error::backend(KIND, format!("unexpected reply {r:?}"))));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::backend(KIND, "short pipeline reply"))))
            .collect()
    }

    /// The fence of a lock a release handed to the waiting `token`, taken at most once; no
    /// I/O. A release that found this waiter at the head of the queue set the lock key to its
    /// token with its whole lease (its place in the queue lasted longer than that), took its
    /// fence and sent it in the wake-up message. Only a hand-over after the server answered
    /// the token's last busy queued attempt counts (see [`Attempt::HandedOver`]), and only
    /// while that attempt's lease, counted from when it was sent, lasts. A grant shorter than
    /// the lease comes without a fence and is no hold until the waiter's next attempt claims
    /// it: the caller's view of the lease must never end after the server's. Not with
    /// `min_replicas`: the release's hand-over is not known to be replicated, so the waiter
    /// confirms it with an attempt of its own, which waits for the replicas.
    pub fn take_grant(&self, name: &LockName, token: Token) -> Option<u64> {
        let grant = self.grants.take(&token.to_hex_bytes());
        let grant = grant.filter(|_| self.replicas.get() == 0);
        if grant.is_some() {
            let key = Self::lock_key(name);
            self.contended.mark(&key);
            self.contended.acquired(&key, self.hold_slice, false);
        }
        grant
    }

    /// Whether this backend's last release of the mutex `name` handed it to a queued waiter
    /// (and it has not held it since): the lock is then somebody else's. No I/O.
    pub fn expects_busy(&self, name: &LockName) -> bool {
        name.kind() == LockKind::Mutex && self.contended.handed_over(&Self::lock_key(name))
    }

    /// One attempt on the server (see [`Backend::acquire`]).
    async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.relisten_if_asked().await;
        let (name, token, lease, mode) =
            (&request.name, request.token, request.lease, request.mode);
        if name.kind() != LockKind::Mutex {
            return match self
                .kind_attempt(name, token, ms(lease), mode, true, -1, request.owner_str())
                .await?
            {
                KindAttempt::Acquired { fence, .. } => Ok(Attempt::Acquired { fence }),
                KindAttempt::Busy { retry_after } => Ok(Attempt::Busy {
                    retry_after,
                    ahead: None,
                }),
                KindAttempt::Disagree { permits } => Err(disagreement(name, permits)),
            };
        }
        self.acquire_mutex(
            &Self::lock_key(name),
            token,
            lease,
            mode,
            request.owner_str(),
        )
        .await
    }

    fn queue_keys(key: &str) -> (String, String) {
        (sibling_key(key, "queue"), sibling_key(key, "waiters"))
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        // Distlock waiters queue in a ZSET; a release hands the lock to the head, so no later
        // attempt (not even a foreign `SET NX`) gets in first.
        Capabilities::new(KIND)
            .fencing(Fencing::MonotonicAcrossDataLoss)
            .notifies_release(true)
            .fifo(true)
            .all_kinds()
            .owners(true)
    }

    /// With [`AcquireMode::Queue`] a busy attempt joins (or refreshes) the token's place in
    /// the wait queue, which it keeps for [`RedisOptions::waiter_ttl`].
    ///
    /// A [`AcquireMode::Try`] attempt is the common protocol's `SET NX PX`, pipelined with
    /// `scripts::FENCE_HELD`, which takes a fence only if the lock carries the caller's token
    /// (so a failed attempt leaves the counter at the holder's fence): one round trip. It need
    /// not look at the wait queue, because a lock with distlock waiters queued is never free:
    /// a release hands it to the head of the queue (see the `RELEASE` script). The fence is
    /// not atomic with the `SET`, and need not be: it runs after the `SET` on the same
    /// connection, so if another holder's fence came between the two, this holder's lease had
    /// already run out on the server, and the script finds another token and takes none.
    ///
    /// A lock that already carries the caller's token (an earlier attempt's reply was lost)
    /// looks busy to a try; the registry's next attempt, in [`AcquireMode::Queue`], is the
    /// script, which recognises it.
    ///
    /// Read, write and permit holds are one script each (`scripts::KIND_ACQUIRE`), which
    /// also keeps a place in the wait queue in [`AcquireMode::Queue`].
    ///
    /// [`AcquireMode::Queue`]: crate::AcquireMode::Queue
    /// [`AcquireMode::Try`]: crate::AcquireMode::Try
    ///
    /// A lock a release handed to the token (the fence came in the wake-up message) is
    /// [`Attempt::HandedOver`] with no I/O, and so is [`Attempt::Busy`] for a
    /// [`waits`](AcquireRequest::waits) try of a mutex this backend's last release handed to a
    /// queued waiter.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease, mode) =
            (&request.name, request.token, request.lease, request.mode);
        if let Some(fence) = self.take_grant(name, token) {
            return Ok(Attempt::HandedOver { fence });
        }
        if mode == crate::AcquireMode::Try && request.waits && self.expects_busy(name) {
            return Ok(Attempt::BUSY);
        }
        let sent = std::time::Instant::now();
        let attempt = self.attempt(request).await;
        if request.queued() && matches!(attempt, Ok(Attempt::Busy { .. })) {
            if let Some(until) = sent.checked_add(lease) {
                self.grants.busy_until(&token.to_hex_bytes(), until);
            }
        }
        attempt
    }

    async fn leave_queue(&self, name: &LockName, token: Token) -> Result<()> {
        self.grants.forget(&token.to_hex_bytes());
        self.leave_key(name, token, true).await
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        if name.kind() != LockKind::Mutex {
            return Ok(Released {
                was_held: self.kind_release(name, token, true).await?,
                contended: false,
            });
        }
        let key = Self::lock_key(name);
        let queue = sibling_key(&key, "queue");
        let owners = sibling_key(&key, "owners");
        let channel = Self::channel(name);
        let token = token.to_hex_bytes();
        // The wait queue already makes the hand-over fair: no grace period needed.
        let released = |was_held| Released {
            was_held,
            contended: false,
        };
        if !self.contended.contains(&key) {
            let published = format!("{channel}:{key}");
            let mut args: Vec<&[u8]> = vec![&token, published.as_bytes()];
            if self.spring_legacy_channel {
                args.push(channel.as_bytes());
            }
            let r = self
                .eval(&self.scripts.release_alone, &[&key, &queue, &owners], &args)
                .await?;
            match r.int() {
                Some(2) => self.contended.mark(&key),
                r => return Ok(released(r == Some(1))),
            }
        }
        let wake = Self::wake_prefix(name);
        let waiters = sibling_key(&key, "waiters");
        let reserve = self.contended.reservation(&key);
        let px = reserve.map(|(ms, _)| (ms + self.waiter_ttl_ms).to_string());
        if let (Some((_, false)), Some(px)) = (reserve, &px) {
            let r = self
                .eval(
                    &self.scripts.reserve,
                    &[&key, &queue, &owners],
                    &[&token, self.reservation.as_bytes(), px.as_bytes()],
                )
                .await?;
            match r.int() {
                Some(4) => {
                    self.contended.released(&key, Left::Reserved);
                    return Ok(released(true));
                }
                Some(0) => return Ok(released(false)),
                // Nobody queued any more: the script below frees the key.
                _ => {}
            }
        }
        let mut args: Vec<&[u8]> = vec![&token, channel.as_bytes(), wake.as_bytes(), self.legacy()];
        if let (Some((_, true)), Some(px)) = (reserve, &px) {
            args.extend([px.as_bytes(), self.reservation.as_bytes(), b"1"]);
        }
        let r = self
            .eval(
                &self.scripts.release,
                &[&key, &sibling_key(&key, "fence"), &queue, &waiters, &owners],
                &args,
            )
            .await?;
        match r.int() {
            Some(1) => {
                self.contended.unmark(&key);
                Ok(released(true))
            }
            r => {
                let left = match r {
                    Some(4) => Left::Reserved,
                    Some(3) => Left::HandedOver,
                    _ => Left::Unknown,
                };
                self.contended.released(&key, left);
                Ok(released(matches!(r, Some(3 | 4))))
            }
        }
    }

    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        if name.kind() != LockKind::Mutex {
            return Ok(self.kind_extend(name, token, ms(lease)).await? > 0);
        }
        let key = Self::lock_key(name);
        let (token, lease) = (token.to_string(), ms(lease).to_string());
        let owners = sibling_key(&key, "owners");
        let r = self
            .eval_owned(
                (&self.scripts.extend, &[&key], &owners),
                &self.scripts.own_extend,
                &[token.as_bytes(), lease.as_bytes()],
                2,
            )
            .await?;
        Ok(r.int() == Some(1))
    }

    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        if self.cluster.is_some() {
            return cluster::extend_by_slot(self, batch).await;
        }
        self.extend_batch(batch).await
    }

    /// Listens to the lock's release channel and to the waiter's own wake-up (the release
    /// script wakes only the head of the wait queue).
    async fn subscribe(&self, name: &LockName, waiter: Token) -> Result<ReleaseSubscription> {
        // One channel per waiting acquisition: it goes with the subscription, so the table
        // does not grow with every contended acquisition.
        let mine = self.signals.subscribe_transient(&waiter.to_string());
        let (sub, fresh) = self.signals.subscribe(&Self::lock_key(name));
        if fresh {
            // The channels are per prefix: forgetting idle keys needs no UNSUBSCRIBE, only
            // bounded bookkeeping.
            self.signals.take_idle(1024);
        }
        self.ensure_listening(name).await?;
        Ok(sub.merge(mine))
    }

    /// Removes whatever holds the key: the mutex string (also a foreign client's), every
    /// reader (and their timeout keys) or writer of the read-write lock, every permit; and
    /// wakes waiters as a release does. The fence counter is kept.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.force_release_key(name, true).await
    }

    /// Whatever holds the key, with its kind, holders, live waiters (its wait queue), the
    /// latest fence issued and the longest lease left.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inspect_key(&Self::lock_key(name)).await
    }

    /// `SCAN` for `<prefix>:*`, then the keys' inspection in pipelines of scripts.
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        self.list_prefix(prefix).await
    }
}
