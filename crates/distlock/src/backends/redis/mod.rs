//! Redis backend, single node: the layout of Spring Integration's `RedisLockRegistry`, so that
//! Java services and distlock exclude each other on the same keys.
//!
//! | what | layout |
//! |---|---|
//! | lock | STRING `<prefix>:<key>` holding the owner token, with a `PX` lease; taken by `SET NX PX` |
//! | release | compare-and-delete script that publishes `<prefix>:<key>` on `<prefix>-channel` and `<prefix>-channel:<prefix>:<key>` (or wakes the first queued distlock waiter) |
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
mod resp;
mod scripts;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSubSink};
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Value};

use self::keys::sibling_key;
use self::resp::{ConnInfo, Pool, Reply, RespError};
use self::scripts::{Lua, Scripts, ACQUIRE, EXTEND, FORCE_RELEASE, INSPECT, LEAVE, RELEASE};

use crate::backend::{
    AcquireMode, AcquireRequest, Attempt, Backend, Capabilities, Fencing, LockInfo, LockName,
    ReleaseSignals, ReleaseSubscription, Released, Renewal, Token,
};
use crate::error::{Error, Result};

const KIND: &str = "redis";

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
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            waiter_ttl: Duration::from_secs(2),
            tls_root_cert_pem: None,
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
    pubsub: tokio::sync::Mutex<PubSub>,
    waiter_ttl_ms: u64,
    /// Names this backend instance's wake channel: queued waiters are woken one at a time.
    instance: String,
}

#[derive(Default)]
struct PubSub {
    sink: Option<PubSubSink>,
    channels: HashSet<String>,
    alive: Option<Weak<()>>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.target)
            .finish()
    }
}

fn map_err(e: RedisError) -> Error {
    let text = e.to_string();
    if e.kind() == ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("NOPERM")
    {
        return Error::backend(KIND, format!("authentication or permission failed: {text}"));
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || text.contains("LOADING")
        || text.contains("BUSY")
        || text.contains("TRYAGAIN")
        || text.contains("MASTERDOWN")
    {
        return Error::unavailable(KIND, text);
    }
    Error::backend(KIND, text)
}

/// Maps an error reply of the server.
fn server_err(text: String) -> Error {
    if text.starts_with("WRONGPASS") || text.starts_with("NOAUTH") || text.starts_with("NOPERM") {
        return Error::backend(KIND, format!("authentication or permission failed: {text}"));
    }
    if [
        "LOADING",
        "BUSY",
        "TRYAGAIN",
        "MASTERDOWN",
        "READONLY",
        "CLUSTERDOWN",
    ]
    .iter()
    .any(|p| text.starts_with(p))
    {
        return Error::unavailable(KIND, text);
    }
    Error::backend(KIND, text)
}

fn resp_err(e: RespError) -> Error {
    match e {
        RespError::Io(e) | RespError::Unsent(e) => Error::unavailable(KIND, e.to_string()),
        RespError::Server(text) => server_err(text),
    }
}

fn from_value(v: Value) -> Reply {
    match v {
        Value::Int(n) => Reply::Int(n),
        Value::Nil => Reply::Bulk(None),
        Value::BulkString(b) => Reply::Bulk(Some(b)),
        Value::SimpleString(s) => Reply::Simple(s),
        Value::Okay => Reply::Simple("OK".into()),
        Value::Array(items) => Reply::Array(Some(items.into_iter().map(from_value).collect())),
        Value::ServerError(e) => Reply::Error(format!("{e:?}")),
        other => Reply::Error(format!("unexpected reply {other:?}")),
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
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects with explicit options.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
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
            })
        });
        let backend = RedisBackend {
            client,
            target,
            config,
            pool,
            conn: Mutex::new(None),
            scripts: Scripts {
                acquire: Lua::with_queue(ACQUIRE, 3, 4),
                release: Lua::with_queue(RELEASE, 2, 3),
                force_release: Lua::with_queue(FORCE_RELEASE, 2, 3),
                leave: Lua::with_queue(LEAVE, 1, 2),
                extend: Lua::new(EXTEND),
                inspect: Lua::new(INSPECT),
            },
            signals: Arc::new(ReleaseSignals::default()),
            pubsub: tokio::sync::Mutex::new(PubSub::default()),
            waiter_ttl_ms: ms(options.waiter_ttl),
            instance: format!("{:016x}", rand::random::<u64>()),
        };
        // Connect now, so that a wrong address or password is reported by `connect`.
        match backend.command(vec![b"PING".to_vec()]).await? {
            Reply::Error(e) => Err(server_err(e)),
            _ => Ok(backend),
        }
    }

    /// How many wake-up channels this backend keeps track of (lock keys listened to, waiters'
    /// own channels): for tests that check the table stays bounded.
    #[doc(hidden)]
    pub fn wake_channels(&self) -> usize {
        self.signals.len()
    }

    async fn connection(&self) -> Result<MultiplexedConnection> {
        if let Some(c) = self.conn.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Ok(c.clone());
        }
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(map_err)?;
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Sends several commands in one round trip; returns their replies in order (error
    /// replies included). A broken connection is dropped so that the next call reconnects.
    async fn pipeline(&self, cmds: Vec<Vec<Vec<u8>>>) -> Result<Vec<Reply>> {
        if let Some(pool) = &self.pool {
            let refs: Vec<Vec<&[u8]>> = cmds
                .iter()
                .map(|c| c.iter().map(Vec::as_slice).collect())
                .collect();
            return pool.pipeline(&refs).await.map_err(|e| {
                pool.clear();
                resp_err(e)
            });
        }
        let mut con = self.connection().await?;
        let mut pipe = redis::pipe();
        for c in &cmds {
            let mut cmd = redis::cmd(&String::from_utf8_lossy(&c[0]));
            for a in &c[1..] {
                cmd.arg(a.as_slice());
            }
            pipe.add_command(cmd);
        }
        match pipe.query_async::<Vec<Value>>(&mut con).await {
            Ok(v) => Ok(v.into_iter().map(from_value).collect()),
            Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) => Ok(cmds
                .iter()
                .map(|_| Reply::Error("NOSCRIPT".into()))
                .collect()),
            Err(e) => {
                if e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error()
                    || e.is_timeout()
                {
                    *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
                Err(map_err(e))
            }
        }
    }

    async fn command(&self, cmd: Vec<Vec<u8>>) -> Result<Reply> {
        let mut replies = self.pipeline(vec![cmd]).await?;
        replies
            .pop()
            .ok_or_else(|| Error::unavailable(KIND, "missing reply"))
    }

    /// Runs `lua` by its SHA, loading it by EVAL when the server lost its script cache (after
    /// a restart). An error reply becomes an error.
    async fn eval(&self, lua: &Lua, keys: &[&str], args: &[&[u8]]) -> Result<Reply> {
        let nkeys = keys.len().to_string();
        let mut cmd: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
        cmd.extend([b"EVALSHA".as_slice(), lua.sha.as_bytes(), nkeys.as_bytes()]);
        cmd.extend(keys.iter().map(|k| k.as_bytes()));
        cmd.extend_from_slice(args);
        let mut reply = self.request(&cmd).await?;
        if matches!(&reply, Reply::Error(e) if e.starts_with("NOSCRIPT")) {
            cmd[0] = b"EVAL";
            cmd[1] = lua.body.as_bytes();
            reply = self.request(&cmd).await?;
        }
        match reply {
            Reply::Error(e) => Err(server_err(e)),
            r => Ok(r),
        }
    }

    /// One command on the lock path's connection.
    async fn request(&self, cmd: &[&[u8]]) -> Result<Reply> {
        if let Some(pool) = &self.pool {
            let mut replies = pool.pipeline(&[cmd]).await.map_err(|e| {
                pool.clear();
                resp_err(e)
            })?;
            return replies
                .pop()
                .ok_or_else(|| Error::unavailable(KIND, "missing reply"));
        }
        let owned = vec![cmd.iter().map(|a| a.to_vec()).collect()];
        let mut replies = self.pipeline(owned).await?;
        replies
            .pop()
            .ok_or_else(|| Error::unavailable(KIND, "missing reply"))
    }

    fn lock_key(name: &LockName) -> String {
        let mut k = String::with_capacity(name.prefix().len() + name.key().len() + 1);
        k.push_str(name.prefix());
        k.push(':');
        k.push_str(name.key());
        k
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

    /// Makes sure the pub/sub connection listens on the prefix's release and wake channels.
    async fn ensure_listening(&self, name: &LockName) -> Result<()> {
        let channel = Self::channel(name);
        let mut ps = self.pubsub.lock().await;
        let dead = ps.alive.as_ref().is_none_or(|w| w.strong_count() == 0);
        if dead {
            let pubsub = self.client.get_async_pubsub().await.map_err(map_err)?;
            let (sink, stream) = pubsub.split();
            let alive = Arc::new(());
            ps.alive = Some(Arc::downgrade(&alive));
            ps.sink = Some(sink);
            ps.channels.clear();
            tokio::spawn(read_messages(
                stream,
                Arc::downgrade(&self.signals),
                format!("-wake:{}", self.instance),
                alive,
            ));
        }
        if !ps.channels.contains(&channel) {
            let sink = ps
                .sink
                .as_mut()
                .ok_or_else(|| Error::unavailable(KIND, "no pub/sub connection"))?;
            let wake = format!("{}{}", Self::wake_prefix(name), self.instance);
            let mut res = sink.subscribe(&[channel.clone(), wake]).await;
            if res.is_ok() {
                res = sink.psubscribe(format!("{channel}:*")).await;
            }
            if let Err(e) = res {
                ps.alive = None;
                return Err(map_err(e));
            }
            ps.channels.insert(channel);
        }
        Ok(())
    }

    fn queue_keys(key: &str) -> (String, String) {
        (sibling_key(key, "queue"), sibling_key(key, "waiters"))
    }
}

/// Turns pub/sub messages into wake-ups: a wake message names the queued waiter's token, a
/// release message the lock key.
async fn read_messages(
    mut stream: redis::aio::PubSubStream,
    signals: Weak<ReleaseSignals>,
    wake_suffix: String,
    _alive: Arc<()>,
) {
    while let Some(msg) = stream.next().await {
        let Some(signals) = signals.upgrade() else {
            return;
        };
        let Ok(payload) = msg.get_payload::<String>() else {
            continue;
        };
        if !msg.from_pattern() && msg.get_channel_name().ends_with(&wake_suffix) {
            if let Some((token, _instance)) = payload.split_once(':') {
                signals.fire(token);
            }
        } else {
            signals.fire(&payload);
        }
    }
    // The connection is gone: wake every waiter so it re-checks (and resubscribes).
    if let Some(signals) = signals.upgrade() {
        signals.fire_all();
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        // Distlock waiters queue in a ZSET and only the head may take a free lock (also
        // against `Try` attempts); foreign `SET NX` clients are not bound by the queue.
        Capabilities::new(KIND)
            .fencing(Fencing::MonotonicAcrossDataLoss)
            .notifies_release(true)
            .fifo(true)
    }

    /// With [`AcquireMode::Queue`] a busy attempt joins (or refreshes) the token's place in
    /// the wait queue, which it keeps for [`RedisOptions::waiter_ttl`].
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease, mode) =
            (&request.name, request.token, request.lease, request.mode);
        let waiter_ttl_ms = match mode {
            AcquireMode::Try => 0,
            AcquireMode::Queue => self.waiter_ttl_ms,
        };
        let key = Self::lock_key(name);
        let fence_key = sibling_key(&key, "fence");
        let (queue, waiters) = Self::queue_keys(&key);
        let member = self.member(token);
        let token = token.to_hex_bytes();
        let (lease, ttl) = (ms(lease).to_string(), waiter_ttl_ms.to_string());
        let reply = self
            .eval(
                &self.scripts.acquire,
                &[&key, &fence_key, &queue, &waiters],
                &[&token, lease.as_bytes(), ttl.as_bytes(), &member],
            )
            .await?;
        let (ok, value) = match reply.ints().as_deref() {
            Some(&[ok, value]) => (ok, value),
            _ => return Err(Error::backend(KIND, format!("unexpected reply {reply:?}"))),
        };
        if ok == 1 {
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

    async fn leave_queue(&self, name: &LockName, token: Token) -> Result<()> {
        let key = Self::lock_key(name);
        let (queue, waiters) = Self::queue_keys(&key);
        let wake = Self::wake_prefix(name);
        let member = self.member(token);
        self.eval(
            &self.scripts.leave,
            &[&queue, &waiters, &key],
            &[&member, wake.as_bytes()],
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
                &[&key, &queue, &waiters],
                &[&token, channel.as_bytes(), wake.as_bytes()],
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
            .eval(
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
        // One pipeline for the whole batch; EVAL keeps it independent of the script cache.
        let cmds = batch
            .iter()
            .map(|r| {
                vec![
                    b"EVAL".to_vec(),
                    EXTEND.as_bytes().to_vec(),
                    b"1".to_vec(),
                    Self::lock_key(&r.name).into_bytes(),
                    r.token.to_string().into_bytes(),
                    ms(r.lease).to_string().into_bytes(),
                ]
            })
            .collect();
        match self.pipeline(cmds).await {
            Ok(v) if v.len() == batch.len() => v
                .into_iter()
                .map(|r| match r {
                    Reply::Error(e) => Err(server_err(e)),
                    r => Ok(r.int() == Some(1)),
                })
                .collect(),
            Ok(_) => batch
                .iter()
                .map(|_| Err(Error::backend(KIND, "short pipeline reply")))
                .collect(),
            Err(e) => {
                let (msg, retry) = (e.to_string(), e.is_retryable());
                batch
                    .iter()
                    .map(|_| {
                        Err(if retry {
                            Error::unavailable(KIND, msg.clone())
                        } else {
                            Error::backend(KIND, msg.clone())
                        })
                    })
                    .collect()
            }
        }
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
                &[&key, &queue, &waiters],
                &[channel.as_bytes(), wake.as_bytes()],
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
