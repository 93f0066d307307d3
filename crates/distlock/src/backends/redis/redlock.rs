//! Redlock: one lock over N independent Redis masters (`redlock://host:port,host:port,host:port`),
//! held while a majority of them hold it.
//!
//! Every node holds the common layout, `<prefix>:<key>` set to the owner token with `PX`, so
//! redsync, node-redlock, pottery and any other `SET NX PX` client on the same nodes exclude
//! distlock, and it excludes them.
//!
//! | operation | on every node, concurrently | outcome |
//! |---|---|---|
//! | acquire | `SET key token NX PX lease+drift` | acquired when a majority answered `OK`; otherwise the nodes that did are released again |
//! | extend | `PEXPIRE` if the node holds the token; while a majority does, `SET NX PX` again on the nodes that lost the key (a restart) | extended when a majority hold it |
//! | release | compare-and-delete | held when a majority deleted it |
//! | inspect | `PTTL` | held when a majority have the key; the lease left is that of the node whose expiry ends the majority |
//!
//! **Validity.** The registry counts every lease from before the request was sent and makes no
//! guard of a reply that comes when a tenth of the lease or less is left; that is Redlock's
//! "lease minus elapsed time" rule. Redlock also subtracts the clock drift between the client
//! and the nodes: the keys are set with [`drift`] added to the lease, so a node whose clock runs
//! that much faster still keeps the key until the client's lease ends.
//!
//! **No fencing.** [`Fencing::None`]: the guards' fences must not fence writes. A fence would have
//! to come from a counter that every later holder reads above every earlier one, and the
//! nodes share nothing: a majority of independent counters can go backwards when a node
//! restarts empty or a different majority answers (Kleppmann, "How to do distributed locking",
//! 2016). Use a backend with fencing (etcd, ZooKeeper, PostgreSQL, Redis single node) where
//! writes must be fenced.
//!
//! **What it cannot promise.** A node that restarts without the key (no persistence) can let
//! a second client build a majority while the first still holds: run the nodes with `appendfsync
//! always`, or keep a restarted node out for longer than the longest lease. Waiters poll (the
//! nodes do not notify), and no wait queue orders them.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;

use super::scripts::{Lua, EXTEND};
use super::transport::server_err;
use super::{ms, RedisBackend, RedisOptions, Reply};
use crate::backend::{
    AcquireRequest, Attempt, Backend, Capabilities, Fencing, LockInfo, LockName, Released, Token,
};
use crate::error::{Error, Result};
use crate::url::{parse_hosts, RawUrl};

const KIND: &str = "redlock";

/// KEYS: lock. ARGV: token. Deletes the key if it holds the token (redsync's release).
const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// The clock drift Redlock allows for: 1% of the lease plus 2 ms.
pub fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// Locks held by a majority of independent Redis masters.
pub struct RedlockBackend {
    nodes: Vec<RedisBackend>,
    quorum: usize,
    unlock: Lua,
    extend: Lua,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("nodes", &self.nodes)
            .field("quorum", &self.quorum)
            .finish()
    }
}

impl RedlockBackend {
    /// Connects to the nodes of `redlock://[user:pass@]host:port,host:port,host:port[/db]`: at
    /// least three, each an independent master; the credentials and database apply to every
    /// node. Fails when fewer than a majority answer, or when a node refuses the credentials.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened.
    pub async fn connect(url: &str) -> Result<Self> {
        let bad =
            |what: String| Error::config(format!("redlock URL {:?}: {what}", crate::redact(url)));
        let raw = RawUrl::split(url)
            .ok_or_else(|| bad("expected redlock://host:port,host:port,host:port".into()))?;
        if !raw.scheme.eq_ignore_ascii_case("redlock") {
            return Err(bad(format!("scheme {:?}: expected redlock", raw.scheme)));
        }
        if raw.query.is_some() {
            return Err(bad("no query parameters are supported".into()));
        }
        let hosts = parse_hosts(raw.hosts, 6379).map_err(bad)?;
        if hosts.len() < 3 {
            return Err(bad(format!(
                "{} node(s) given; Redlock needs at least three independent masters",
                hosts.len()
            )));
        }
        let userinfo = raw.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let nodes = hosts
            .iter()
            .map(|h| {
                RedisBackend::build(
                    &format!("redis://{userinfo}{h}{}", raw.path),
                    RedisOptions::default(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let backend = RedlockBackend {
            quorum: nodes.len() / 2 + 1,
            nodes,
            unlock: Lua::new(UNLOCK),
            extend: Lua::new(EXTEND),
        };
        let pings = join_all(backend.nodes.iter().map(|n| n.ping())).await;
        let mut unreachable = Vec::new();
        for (ping, host) in pings.into_iter().zip(&hosts) {
            match ping {
                Ok(()) => {}
                Err(e @ Error::Unavailable { .. }) => unreachable.push(format!("{host}: {e}")),
                Err(e) => return Err(e),
            }
        }
        if hosts.len() - unreachable.len() < backend.quorum {
            return Err(Error::unavailable(
                KIND,
                format!(
                    "only {} of {} nodes answer, a majority is {}: {}",
                    hosts.len() - unreachable.len(),
                    hosts.len(),
                    backend.quorum,
                    unreachable.join("; ")
                ),
            ));
        }
        Ok(backend)
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Runs `op` on every node concurrently, each bounded by `timeout`; a node that does not
    /// answer in time counts as an error.
    async fn on_all(&self, timeout: Duration, op: Op<'_>) -> Vec<Result<Reply>> {
        join_all(self.nodes.iter().map(|n| async move {
            let call = async {
                match op {
                    Op::Command(cmd) => n.request(cmd).await,
                    Op::Script(lua, keys, args) => n.eval(lua, keys, args).await,
                }
            };
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| Err(Error::unavailable(KIND, "no reply in time")))
        }))
        .await
    }

    /// Releases `token` on every node; returns how many deleted it.
    async fn unlock_all(&self, key: &str, hex: &[u8]) -> Result<usize> {
        let replies = self
            .on_all(NODE_TIMEOUT, Op::Script(&self.unlock, &[key], &[hex]))
            .await;
        self.count(replies, |r| r.int() == Some(1))
    }

    /// Counts the replies that `ok` accepts; fails when fewer than a majority of nodes
    /// answered at all, with the first error.
    fn count(&self, replies: Vec<Result<Reply>>, ok: impl Fn(&Reply) -> bool) -> Result<usize> {
        let mut yes = 0;
        let mut answered = 0;
        let mut first_error = None;
        for r in replies {
            match r {
                Ok(Reply::Error(e)) => {
                    first_error.get_or_insert(server_err(e));
                }
                Ok(r) => {
                    answered += 1;
                    yes += usize::from(ok(&r));
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if answered < self.quorum && yes < self.quorum => Err(e),
            _ => Ok(yes),
        }
    }
}

/// One request, sent to every node.
#[derive(Clone, Copy)]
enum Op<'a> {
    Command(&'a [&'a [u8]]),
    Script(&'a Lua, &'a [&'a str], &'a [&'a [u8]]),
}

/// How long one node may take to answer before it counts as failed. Redlock wants it small
/// next to the lease, so that a dead node costs an attempt little of its validity.
const NODE_TIMEOUT: Duration = Duration::from_secs(1);

fn node_timeout(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(20), NODE_TIMEOUT)
}

#[async_trait]
impl Backend for RedlockBackend {
    /// No fencing, no notifications (waiters poll), no queue.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(KIND).fencing(Fencing::None)
    }

    /// Every attempt is a plain try: Redlock has no wait queue.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let key = RedisBackend::lock_key(name);
        let hex = token.to_hex_bytes();
        let px = ms(lease + drift(lease)).to_string();
        let replies = self
            .on_all(
                node_timeout(lease),
                Op::Command(&[b"SET", key.as_bytes(), &hex, b"NX", b"PX", px.as_bytes()]),
            )
            .await;
        let won = self.count(replies, |r| matches!(r, Reply::Simple(_)));
        match won {
            Ok(n) if n >= self.quorum => Ok(Attempt::Acquired { fence: 0 }),
            outcome => {
                // No majority: give back what this attempt took, so that the nodes it won do
                // not block the next contender for a whole lease.
                self.unlock_all(&key, &hex).await?;
                outcome.map(|_| Attempt::Busy { retry_after: None })
            }
        }
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let deleted = self
            .unlock_all(&RedisBackend::lock_key(name), &token.to_hex_bytes())
            .await?;
        Ok(Released {
            was_held: deleted >= self.quorum,
            contended: false,
        })
    }

    /// Extends the key on the nodes that hold it. Only while that is a majority, the nodes
    /// that lost it (a restart without persistence) get it set again, so the hold goes on
    /// resting on all of them; a key deleted on a majority is lost, never taken back.
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let key = RedisBackend::lock_key(name);
        let hex = token.to_hex_bytes();
        let px = ms(lease + drift(lease)).to_string();
        let timeout = node_timeout(lease);
        let replies = self
            .on_all(
                timeout,
                Op::Script(&self.extend, &[&key], &[&hex, px.as_bytes()]),
            )
            .await;
        let lost: Vec<&RedisBackend> = replies
            .iter()
            .zip(&self.nodes)
            .filter(|(r, _)| matches!(r, Ok(Reply::Int(0))))
            .map(|(_, n)| n)
            .collect();
        if self.count(replies, |r| r.int() == Some(1))? < self.quorum {
            return Ok(false);
        }
        let set: &[&[u8]] = &[b"SET", key.as_bytes(), &hex, b"NX", b"PX", px.as_bytes()];
        join_all(
            lost.iter()
                .map(|n| tokio::time::timeout(timeout, n.request(set))),
        )
        .await;
        Ok(true)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let key = RedisBackend::lock_key(name);
        let replies = self
            .on_all(NODE_TIMEOUT, Op::Command(&[b"PTTL", key.as_bytes()]))
            .await;
        // Per node that has the key: its lease left, `None` without expiry (PTTL -1).
        let mut left: Vec<Option<u64>> = replies
            .iter()
            .filter_map(|r| r.as_ref().ok().and_then(Reply::int))
            .filter(|p| *p != -2)
            .map(|p| u64::try_from(p).ok())
            .collect();
        self.count(replies, |_| true)?;
        if left.len() < self.quorum {
            return Ok(None);
        }
        // The majority lasts until the quorum-th longest lease ends.
        left.sort_unstable_by_key(|p| std::cmp::Reverse(p.unwrap_or(u64::MAX)));
        Ok(Some(LockInfo {
            fence: None,
            remaining: left[self.quorum - 1].map(Duration::from_millis),
        }))
    }

    /// Deletes the key on every node whoever holds it.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let key = RedisBackend::lock_key(name);
        let replies = self
            .on_all(NODE_TIMEOUT, Op::Command(&[b"DEL", key.as_bytes()]))
            .await;
        Ok(self.count(replies, |r| r.int() == Some(1))? > 0)
    }
}
