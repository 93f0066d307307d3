//! Redis backend, single node: the layout of Spring Integration's `RedisLockRegistry`, so that
//! Java services and distlock exclude each other on the same keys.
//!
//! | what | layout |
//! |---|---|
//! | lock | STRING `<prefix>:<key>` holding the owner token, with a `PX` lease; taken by `SET NX PX` |
//! | acquire | `SET NX PX` pipelined with the fence's `INCR` (a script once waiters queue) |
//! | release | compare-and-delete script that hands the lock to the first queued distlock waiter, or deletes it and publishes `<prefix>:<key>` on `<prefix>-channel:<prefix>:<key>` (and, if asked, `<prefix>-channel`) |
//! | fence | counter in the lock key's hash slot, seeded from the server's clock in µs |
//! | wait queue | ZSET + HASH in the lock key's hash slot: FIFO order and each waiter's expiry |
//!
//! Any client of the common `SET key token NX PX` protocol (Spring, redis-py's `Lock`,
//! redsync) is excluded by and excludes distlock. Because the fence counter restarts from the
//! server's clock whenever it is missing, it keeps increasing after a restart that lost all
//! data (as long as the server's clock does not step back).
//!
//! Plain `redis://` connections use a small built-in RESP client on the lock path;
//! `rediss://` (TLS) goes through the `redis` crate. Pub/sub always uses the `redis` crate.

mod keys;
mod notify;
pub mod redlock;
mod resp;
mod scripts;
mod sentinel;
#[cfg(test)]
mod tests;
mod transport;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use self::keys::sibling_key;
use self::notify::{Grants, PubSub};
use self::resp::{ConnInfo, Pool, Reply};
use self::scripts::{
    Lua, Scripts, ACQUIRE, EXTEND, EXTEND_MANY, FENCE_SEED, FORCE_RELEASE, INSPECT, LEAVE, RELEASE,
};
use self::transport::server_err;

use crate::backend::{
    AcquireMode, AcquireRequest, Attempt, Backend, Capabilities, Fencing, LockInfo, LockName,
    ReleaseSignals, ReleaseSubscription, Released, Renewal, Token,
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
    /// that crashed holds up the queue for at most this long.
    pub waiter_ttl: Duration,
    /// For `rediss://`: the PEM certificate(s) of the authority that signed the server's
    /// certificate, when it is not in the system's trust store (a private CA).
    pub tls_root_cert_pem: Option<Vec<u8>>,
    /// Also publish a release on `<prefix>-channel`, where Spring Integration up to 6.5.2
    /// listens (default false). Releases are always published on
    /// `<prefix>-channel:<prefix>:<key>`, where later versions listen; the second message
    /// costs the server about 5% more per lock cycle.
    pub spring_legacy_channel: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            waiter_ttl: Duration::from_secs(2),
            tls_root_cert_pem: None,
            spring_legacy_channel: false,
        }
    }
}

/// Locks on one Redis server (`redis://[user:pass@]host:port[/db]`, or `rediss://` for TLS).
pub struct RedisBackend {
    client: redis::Client,
    target: String,
    config: AsyncConnectionConfig,
    /// The lock path's connections: the built-in client for plain TCP, else the `redis` crate.
    pool: Option<Pool>,
    conn: Mutex<Option<MultiplexedConnection>>,
    scripts: Scripts,
    signals: Arc<ReleaseSignals>,
    grants: Arc<Grants>,
    pubsub: tokio::sync::Mutex<PubSub>,
    waiter_ttl_ms: u64,
    spring_legacy_channel: bool,
    /// Replicas that must acknowledge an acquisition or extension (`WAIT`), 0 for none.
    min_replicas: u32,
    replica_timeout_ms: u64,
    /// With Sentinel: how to reach the current master's pub/sub.
    sentinel: Option<sentinel::Mode>,
    /// Names this backend instance's wake channel: queued waiters are woken one at a time.
    instance: String,
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
    /// [`RedisOptions::spring_legacy_channel`]); the rest of it goes to the `redis` crate.
    pub async fn connect(url: &str) -> Result<Self> {
        if url.starts_with("redis+sentinel://") {
            return sentinel::connect(url, RedisOptions::default()).await;
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
        let host = parsed.host_str().unwrap_or("");
        if host.is_empty() {
            return Err(Error::config(format!(
                "redis URL {:?}: the host is missing",
                crate::redact(url)
            )));
        }
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
            })
        });
        Ok(RedisBackend {
            client,
            target,
            config,
            pool,
            conn: Mutex::new(None),
            scripts: Scripts {
                acquire: Lua::with_queue(ACQUIRE),
                release: Lua::with_queue(RELEASE),
                force_release: Lua::with_queue(FORCE_RELEASE),
                leave: Lua::with_queue(LEAVE),
                extend: Lua::new(EXTEND),
                extend_many: Lua::new(EXTEND_MANY),
                inspect: Lua::new(INSPECT),
            },
            signals: Arc::new(ReleaseSignals::default()),
            grants: Arc::default(),
            pubsub: tokio::sync::Mutex::new(PubSub::default()),
            waiter_ttl_ms: ms(options.waiter_ttl),
            spring_legacy_channel: options.spring_legacy_channel,
            min_replicas: 0,
            replica_timeout_ms: 1000,
            sentinel: None,
            instance: format!("{:016x}", rand::random::<u64>()),
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

    /// The scripted attempt: joins the wait queue in [`AcquireMode::Queue`], takes over a lock
    /// already held with `token`, seeds the fence counter.
    async fn acquire_script(
        &self,
        key: &str,
        fence_key: &str,
        token: Token,
        hex: &[u8],
        lease_ms: &str,
        mode: AcquireMode,
    ) -> Result<Attempt> {
        let waiter_ttl_ms = match mode {
            AcquireMode::Try => 0,
            AcquireMode::Queue => self.waiter_ttl_ms,
        };
        let (queue, waiters) = Self::queue_keys(key);
        let member = self.member(token);
        let ttl = waiter_ttl_ms.to_string();
        let reply = self
            .eval_replicated(
                &self.scripts.acquire,
                &[key, fence_key, &queue, &waiters],
                &[hex, lease_ms.as_bytes(), ttl.as_bytes(), &member],
            )
            .await?;
        let (ok, value) = match reply.ints().as_deref() {
            Some(&[ok, value]) => (ok, value),
            _ => return Err(Error::backend(KIND, format!("unexpected reply {reply:?}"))),
        };
        if ok == 1 {
            // A hand-over whose message came while this attempt ran is superseded by it.
            self.grants.take(&token.to_hex_bytes());
            let fence = u64::try_from(value)
                .map_err(|_| Error::backend(KIND, format!("fence {value} is negative")))?;
            Ok(Attempt::Acquired { fence })
        } else {
            // PTTL -1: a foreign client set the key without expiry; -2: free, but others are
            // queued first (or it just vanished).
            let retry_after = u64::try_from(value).ok().map(Duration::from_millis);
            Ok(Attempt::Busy { retry_after })
        }
    }

    /// Sends [`scripts::EXTEND_MANY`] (by SHA, or its body with `EVAL`) once per chunk of
    /// [`RENEW_CHUNK`] locks, in one pipeline.
    async fn extend_chunks(
        &self,
        script: &[u8],
        keys: &[String],
        args: &[([u8; 32], String)],
    ) -> Result<Vec<Reply>> {
        let verb: &[u8] = if script.len() == 40 {
            b"EVALSHA"
        } else {
            b"EVAL"
        };
        let counts: Vec<String> = keys
            .chunks(RENEW_CHUNK)
            .map(|c| c.len().to_string())
            .collect();
        let cmds: Vec<Vec<&[u8]>> = keys
            .chunks(RENEW_CHUNK)
            .zip(args.chunks(RENEW_CHUNK))
            .zip(&counts)
            .map(|((keys, args), n)| {
                let mut cmd: Vec<&[u8]> = Vec::with_capacity(3 + 3 * keys.len());
                cmd.extend([verb, script, n.as_bytes()]);
                cmd.extend(keys.iter().map(|k| k.as_bytes()));
                for (token, lease) in args {
                    cmd.extend([token.as_slice(), lease.as_bytes()]);
                }
                cmd
            })
            .collect();
        let refs: Vec<&[&[u8]]> = cmds.iter().map(Vec::as_slice).collect();
        let (replies, acked) = self.pipeline_then_wait(&refs, true).await?;
        self.check_replicated(acked)?;
        Ok(replies)
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
    }

    /// With [`AcquireMode::Queue`] a busy attempt joins (or refreshes) the token's place in
    /// the wait queue, which it keeps for [`RedisOptions::waiter_ttl`].
    ///
    /// A [`AcquireMode::Try`] attempt is the common protocol's `SET NX PX`, pipelined with the
    /// fence's `INCR`: one round trip and no script, which is most of what a lock cycle costs
    /// the server. It need not look at the wait queue, because a lock with distlock waiters
    /// queued is never free: a release hands it to the head of the queue (see
    /// the `RELEASE` script). The `INCR` is not atomic with the `SET`, and need not be: it
    /// runs after the `SET` on the same connection, so if another holder's `INCR` came
    /// between the two, this holder's lease had already run out on the server before its own
    /// `INCR` ran, and the reply arrives too late for the registry to make a guard of it.
    ///
    /// A lock that already carries the caller's token (an earlier attempt's reply was lost)
    /// looks busy to a try; the registry's next attempt, in [`AcquireMode::Queue`], is the
    /// script, which recognises it.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease, mode) =
            (&request.name, request.token, request.lease, request.mode);
        let key = Self::lock_key(name);
        let fence_key = sibling_key(&key, "fence");
        let hex = token.to_hex_bytes();
        let lease_ms = ms(lease).to_string();
        if mode == AcquireMode::Try {
            let set: &[&[u8]] = &[
                b"SET",
                key.as_bytes(),
                &hex,
                b"NX",
                b"PX",
                lease_ms.as_bytes(),
            ];
            let incr: &[&[u8]] = &[b"INCR", fence_key.as_bytes()];
            let (replies, acked) = self.pipeline_then_wait(&[set, incr], true).await?;
            // Checked only once taken: a busy attempt wrote nothing that matters.
            if matches!(replies.first(), Some(Reply::Simple(_))) {
                self.check_replicated(acked)?;
            }
            match <[Reply; 2]>::try_from(replies) {
                Ok([Reply::Bulk(None), _]) => return Ok(Attempt::Busy { retry_after: None }),
                Ok([Reply::Simple(_), Reply::Int(f)]) if f >= FENCE_SEED => {
                    return Ok(Attempt::Acquired { fence: f as u64 })
                }
                // Taken, but the fence counter must be seeded first: the script does that.
                Ok([Reply::Simple(_), Reply::Int(_)]) => {}
                Ok([Reply::Error(e), _] | [_, Reply::Error(e)]) => return Err(server_err(e)),
                r => return Err(Error::backend(KIND, format!("unexpected replies {r:?}"))),
            }
        }
        self.acquire_script(&key, &fence_key, token, &hex, &lease_ms, mode)
            .await
    }

    /// A release that found this waiter at the head of the queue set the lock key to its token
    /// with its lease, took its fence and sent both in the wake-up message.
    /// Not with `min_replicas`: the release's hand-over is not known to be replicated, so the
    /// waiter confirms it with an attempt of its own, which waits for the replicas.
    fn take_grant(&self, _name: &LockName, token: Token) -> Option<u64> {
        let grant = self.grants.take(&token.to_hex_bytes());
        grant.filter(|_| self.min_replicas == 0)
    }

    async fn leave_queue(&self, name: &LockName, token: Token) -> Result<()> {
        self.grants.take(&token.to_hex_bytes());
        let key = Self::lock_key(name);
        let (queue, waiters) = Self::queue_keys(&key);
        let channel = Self::channel(name);
        let wake = Self::wake_prefix(name);
        let member = self.member(token);
        self.eval(
            &self.scripts.leave,
            &[&key, &sibling_key(&key, "fence"), &queue, &waiters],
            &[&member, wake.as_bytes(), channel.as_bytes(), self.legacy()],
        )
        .await?;
        Ok(())
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let key = Self::lock_key(name);
        let (queue, waiters) = Self::queue_keys(&key);
        let channel = Self::channel(name);
        let wake = Self::wake_prefix(name);
        let token = token.to_hex_bytes();
        let r = self
            .eval(
                &self.scripts.release,
                &[&key, &sibling_key(&key, "fence"), &queue, &waiters],
                &[&token, channel.as_bytes(), wake.as_bytes(), self.legacy()],
            )
            .await?;
        // The wait queue already makes the hand-over fair: no grace period needed.
        Ok(Released {
            was_held: r.int() == Some(1),
            contended: false,
        })
    }

    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let key = Self::lock_key(name);
        let (token, lease) = (token.to_string(), ms(lease).to_string());
        let r = self
            .eval_replicated(
                &self.scripts.extend,
                &[&key],
                &[token.as_bytes(), lease.as_bytes()],
            )
            .await?;
        Ok(r.int() == Some(1))
    }

    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        if batch.len() == 1 {
            return vec![
                self.extend(&batch[0].name, batch[0].token, batch[0].lease)
                    .await,
            ];
        }
        // One script call per chunk of locks, all chunks in one pipeline: the server runs a
        // loop instead of parsing and dispatching a command per lock.
        let keys: Vec<String> = batch.iter().map(|r| Self::lock_key(&r.name)).collect();
        let args: Vec<([u8; 32], String)> = batch
            .iter()
            .map(|r| (r.token.to_hex_bytes(), ms(r.lease).to_string()))
            .collect();
        let lua = &self.scripts.extend_many;
        let mut result = self.extend_chunks(lua.sha.as_bytes(), &keys, &args).await;
        if matches!(&result, Ok(replies) if replies.iter().any(|r| matches!(r, Reply::Error(e) if e.starts_with("NOSCRIPT"))))
        {
            // The server lost its script cache (a restart): send the body this once.
            result = self.extend_chunks(lua.body.as_bytes(), &keys, &args).await;
        }
        let replies = match result {
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
        let mut out = Vec::with_capacity(batch.len());
        for (reply, chunk) in replies.into_iter().zip(batch.chunks(RENEW_CHUNK)) {
            match reply {
                Reply::Array(Some(items)) if items.len() == chunk.len() => {
                    out.extend(items.iter().map(|r| Ok(r.int() == Some(1))))
                }
                Reply::Error(e) => out.extend(chunk.iter().map(|_| Err(server_err(e.clone())))),
                r => out.extend(
                    chunk
                        .iter()
                        .map(|_| Err(Error::backend(KIND, format!("unexpected reply {r:?}")))),
                ),
            }
        }
        out.resize_with(batch.len(), || {
            Err(Error::backend(KIND, "short pipeline reply"))
        });
        out
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

    /// Deletes the lock key whoever holds it (also a foreign client's), and wakes waiters as a
    /// release does. The fence counter is kept.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let key = Self::lock_key(name);
        let (queue, waiters) = Self::queue_keys(&key);
        let channel = Self::channel(name);
        let wake = Self::wake_prefix(name);
        let r = self
            .eval(
                &self.scripts.force_release,
                &[&key, &sibling_key(&key, "fence"), &queue, &waiters],
                &[channel.as_bytes(), wake.as_bytes(), self.legacy()],
            )
            .await?;
        Ok(r.int() == Some(1))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let key = Self::lock_key(name);
        let fence_key = sibling_key(&key, "fence");
        let r = self
            .eval(&self.scripts.inspect, &[&key, &fence_key], &[])
            .await?;
        let (pttl, fence) = match r.ints().as_deref() {
            Some(&[pttl, fence]) => (pttl, fence),
            _ => return Err(Error::backend(KIND, format!("unexpected reply {r:?}"))),
        };
        if pttl == -2 {
            return Ok(None);
        }
        Ok(Some(LockInfo {
            fence: u64::try_from(fence).ok(),
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        }))
    }
}
