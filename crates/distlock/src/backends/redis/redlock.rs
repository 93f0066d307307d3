//! Redlock: one lock over N independent Redis masters (`redlock://host:port,host:port,host:port`,
//! or `redlocks://…[?ca_file=…]` over TLS), held while a majority of them hold it.
//!
//! Every node holds the common layout, `<prefix>:<key>` set to the owner token with `PX`, so
//! redsync, node-redlock, pottery and any other `SET NX PX` client on the same nodes exclude
//! distlock, and it excludes them.
//!
//! | operation | on every node, concurrently | outcome |
//! |---|---|---|
//! | acquire | `SET key token NX PX lease+drift` (in a script that also records the owner, see below) | acquired when a majority answered `OK`; otherwise the nodes that did are released again |
//! | extend | `PEXPIRE` if the node holds the token; while a majority does, `SET NX PX` again on the nodes that lost the key (a restart) | extended when a majority hold it |
//! | release | compare-and-delete | held when a majority deleted it |
//! | inspect | the single-node `INSPECT` script | held when a majority have the key; the lease left is that of the node whose expiry ends the majority |
//! | list | `SCAN` and `INSPECT`, as on one node | the keys a majority hold |
//!
//! **Owners.** Each node records the descriptions of the holds it granted beside the lock key,
//! as a single node does (the `owners` hash, see `scripts::QUEUE`); the key itself stays the
//! bare token. `inspect` and `list` report the owners that most of the agreeing nodes report:
//! every node of a majority granted the same holds, so any of them tells who holds. A node
//! that lost the key and had it set again by an extension records no description; it is
//! outvoted by the others.
//!
//! **Read-write locks and semaphores** run the single-node scripts (`scripts::KIND_ACQUIRE`,
//! `KIND_RELEASE`, `KIND_EXTEND`) on every node with `fifo` off: a hold counts when a majority
//! of nodes granted it. A waiting exclusive attempt (mutex or writer) keeps a place in each
//! node's wait queue, which only keeps new readers out (a reader needs a majority of nodes
//! without an exclusive waiter); there is no head rule and no hand-over, since each node
//! would pick its own head. A permit also needs the same slot (its number below N) on that
//! majority: permits counted per node could otherwise add up to more holders than N (three
//! holders of two permits, each on a different pair of three nodes); one holder per slot per
//! majority, as for a mutex, bounds them by N.
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

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;

use super::keys::sibling_key;
use super::kinds::{disagreement, KindAttempt};
use super::scripts::{Lua, EXTEND};
use super::transport::server_err;
use super::{ms, RedisBackend, RedisOptions, Reply};
use crate::backend::{
    AcquireMode, AcquireRequest, Attempt, Backend, Capabilities, Fencing, ListedLock, LockInfo,
    LockKind, LockName, Released, Token,
};
use crate::error::{Error, Result};
use crate::url::{parse_hosts, RawUrl};

const KIND: &str = "redlock";

/// KEYS: lock, owners. ARGV: token. Deletes the key if it holds the token (redsync's
/// release), and the holder's description with it. `pcall`: a hash at the key (a read-write
/// lock, a semaphore) is not ours.
const UNLOCK: &str = r"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// KEYS: lock, owners. ARGV: token, `PX`, owner description. A mutex try on one node: the
/// common `SET NX PX` (what redsync and every other client sends), and when it wins, the
/// holder's description in the owners hash, which keeps the same expiry; in one round trip.
const OWNED_SET: &str = r"
local won = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if won then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return won
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
    owned_set: Lua,
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
    /// node. `redlocks://…[?ca_file=/path/ca.pem]` reaches every node over TLS (`rediss://`),
    /// verifying its certificate against `ca_file` (PEM), else the Mozilla roots. Fails when
    /// fewer than a majority answer, or when a node refuses the credentials or its certificate
    /// is not trusted.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened.
    pub async fn connect(url: &str) -> Result<Self> {
        let bad =
            |what: String| Error::config(format!("redlock URL {:?}: {what}", crate::redact(url)));
        let raw = RawUrl::split(url)
            .ok_or_else(|| bad("expected redlock://host:port,host:port,host:port".into()))?;
        let tls = raw.scheme.eq_ignore_ascii_case("redlocks");
        if !tls && !raw.scheme.eq_ignore_ascii_case("redlock") {
            return Err(bad(format!(
                "scheme {:?}: expected redlock, or redlocks for TLS",
                raw.scheme
            )));
        }
        let mut params = crate::url::Params::form("redlock", raw.query).unique()?;
        let ca_file = params.string("ca_file");
        let allow_insecure_auth = params.bool("allow_insecure_auth")?.unwrap_or(false);
        params.finish(&["ca_file", "allow_insecure_auth"])?;
        let mut options = RedisOptions {
            allow_insecure_auth,
            ..RedisOptions::default()
        };
        match (&ca_file, tls) {
            (Some(_), false) => return Err(bad("ca_file needs redlocks:// (TLS)".into())),
            (Some(path), true) => {
                let pem = std::fs::read(path)
                    .map_err(|e| bad(format!("ca_file {path:?} cannot be read: {e}")))?;
                options.tls_root_cert_pem = Some(pem);
            }
            (None, _) => {}
        }
        let scheme = if tls { "rediss" } else { "redis" };
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
                    &format!("{scheme}://{userinfo}{h}{}", raw.path),
                    options.clone(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let backend = RedlockBackend {
            quorum: nodes.len() / 2 + 1,
            nodes,
            unlock: Lua::new(UNLOCK),
            extend: Lua::new(EXTEND),
            owned_set: Lua::new(OWNED_SET),
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
                    Op::Script(lua, keys, args) => n.eval(lua, keys, args).await,
                }
            };
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| Err(Error::unavailable(KIND, "no reply in time")))
        }))
        .await
    }

    /// Runs `op` on every node concurrently, each bounded by `timeout`, as [`Self::on_all`]
    /// does, for operations whose arguments differ per node.
    async fn on_each<'a, T, F, Fut>(&'a self, timeout: Duration, op: F) -> Vec<Result<T>>
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        join_all(self.nodes.iter().map(|n| {
            let call = op(n);
            async move {
                tokio::time::timeout(timeout, call)
                    .await
                    .unwrap_or_else(|_| Err(Error::unavailable(KIND, "no reply in time")))
            }
        }))
        .await
    }

    /// Counts the nodes that answered true; fails when fewer than a majority answered at
    /// all, with the first error.
    fn tally(&self, answers: impl IntoIterator<Item = Result<bool>>) -> Result<usize> {
        let (mut yes, mut answered, mut first_error) = (0, 0, None);
        for a in answers {
            match a {
                Ok(ok) => {
                    answered += 1;
                    yes += usize::from(ok);
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

    /// Gives back a read, write or permit hold on every node (an attempt without a
    /// majority); returns how many still had it live.
    async fn release_kind_all(&self, name: &LockName, token: Token) -> Result<usize> {
        let answers = self
            .on_each(NODE_TIMEOUT, |n| n.kind_release(name, token, false))
            .await;
        self.tally(answers)
    }

    /// One attempt at a read, write or permit hold on every node.
    async fn acquire_kind(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let px = ms(lease + drift(lease));
        let answers = self
            .on_each(node_timeout(lease), |n| {
                n.kind_attempt(
                    name,
                    token,
                    px,
                    request.mode,
                    false,
                    -1,
                    request.owner_str(),
                )
            })
            .await;
        let theirs = answers.iter().find_map(|a| match a {
            Ok(KindAttempt::Disagree { permits }) => Some(*permits),
            _ => None,
        });
        // Per slot, the nodes that granted it (one slot for readers and writers).
        let mut slots: HashMap<i64, Vec<usize>> = HashMap::new();
        for (i, a) in answers.iter().enumerate() {
            if let Ok(KindAttempt::Acquired { slot, .. }) = a {
                slots.entry(*slot).or_default().push(i);
            }
        }
        let best = slots
            .iter()
            .max_by_key(|(slot, nodes)| (nodes.len(), std::cmp::Reverse(**slot)))
            .map(|(slot, nodes)| (*slot, nodes.len()));
        let won = self.tally(
            answers
                .into_iter()
                .map(|a| a.map(|a| matches!(a, KindAttempt::Acquired { .. }))),
        );
        match (won, best, theirs) {
            (Ok(_), Some((slot, n)), None) if n >= self.quorum => {
                // A permit granted another slot on some node is no part of this hold there.
                let strays: Vec<&RedisBackend> = slots
                    .iter()
                    .filter(|(s, _)| **s != slot)
                    .flat_map(|(_, nodes)| nodes.iter().map(|&i| &self.nodes[i]))
                    .collect();
                join_all(strays.iter().map(|n| {
                    tokio::time::timeout(NODE_TIMEOUT, n.kind_release(name, token, false))
                }))
                .await;
                Ok(Attempt::Acquired { fence: 0 })
            }
            (won, _, theirs) => {
                // No majority: give back what this attempt took, so that the nodes it won do
                // not block the next contender for a whole lease.
                self.release_kind_all(name, token).await?;
                if let Some(permits) = theirs {
                    return Err(disagreement(name, permits));
                }
                won.map(|_| Attempt::BUSY)
            }
        }
    }

    /// A waiting mutex attempt: `SET NX PX` on every node by the single-node `ACQUIRE`
    /// script without its head rule, which also keeps (or drops, once taken) a place in
    /// each node's wait queue, so that new readers stay out while it waits.
    async fn acquire_queued_mutex(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let key = RedisBackend::lock_key(name);
        let fence_key = sibling_key(&key, "fence");
        let hex = token.to_hex_bytes();
        let px = ms(lease + drift(lease)).to_string();
        let answers = self
            .on_each(node_timeout(lease), |n| {
                let (key, fence_key, px) = (&key, &fence_key, &px);
                async move {
                    n.acquire_script(
                        key,
                        fence_key,
                        token,
                        &hex,
                        px,
                        AcquireMode::Queue,
                        false,
                        request.owner_str(),
                    )
                    .await
                    .map(|a| matches!(a, Attempt::Acquired { .. }))
                }
            })
            .await;
        match self.tally(answers) {
            Ok(n) if n >= self.quorum => Ok(Attempt::Acquired { fence: 0 }),
            outcome => {
                self.unlock_all(&key, &hex).await?;
                outcome.map(|_| Attempt::BUSY)
            }
        }
    }

    /// What a majority of nodes say of a key (`infos`: those that have it): held when at
    /// least a majority do; the lease left, holders and waiters that a majority agree on at
    /// least; the kind most of them report.
    fn agree(&self, mut infos: Vec<LockInfo>) -> Option<LockInfo> {
        if infos.len() < self.quorum {
            return None;
        }
        let q = self.quorum - 1;
        infos.sort_unstable_by_key(|i| std::cmp::Reverse(i.remaining.unwrap_or(Duration::MAX)));
        let remaining = infos[q].remaining;
        let mut kinds: Vec<LockKind> = infos.iter().filter_map(|i| i.kind).collect();
        kinds.sort_unstable();
        let kind = kinds
            .chunk_by(|a, b| a == b)
            .max_by_key(|run| run.len())
            .map(|run| run[0]);
        let quorum_th = |mut v: Vec<u32>| {
            v.sort_unstable_by(|a, b| b.cmp(a));
            v.get(q).copied().unwrap_or(0)
        };
        let holders = quorum_th(infos.iter().filter_map(|i| i.holders).collect());
        // The owners most nodes report: each node records the descriptions of the holds it
        // granted, so any node of the majority tells who holds.
        let mut lists: Vec<&Vec<String>> = infos.iter().map(|i| &i.owners).collect();
        lists.sort();
        let owners = lists
            .chunk_by(|a, b| a == b)
            .max_by_key(|run| run.len())
            .map(|run| run[0].clone())
            .unwrap_or_default();
        let waiters = infos.iter().filter_map(|i| i.waiters).max().unwrap_or(0);
        let mut info = LockInfo::new(None, remaining)
            .with_holders(holders)
            .with_waiters(waiters)
            .with_owners(owners);
        if let Some(kind) = kind {
            info = info.with_kind(kind);
        }
        Some(info)
    }

    /// Releases `token` on every node; returns how many deleted it.
    async fn unlock_all(&self, key: &str, hex: &[u8]) -> Result<usize> {
        let replies = self
            .on_all(
                NODE_TIMEOUT,
                Op::Script(&self.unlock, &[key, &sibling_key(key, "owners")], &[hex]),
            )
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
    /// No fencing, no notifications (waiters poll), no fair queue; every kind.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(KIND)
            .fencing(Fencing::None)
            .all_kinds()
            .owners(true)
    }

    /// A mutex try is `SET NX PX` on every node. A waiting mutex attempt also keeps a place
    /// in each node's queue, so that new readers stay out while it waits; reads, writes and
    /// permits run the single-node script on each node.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        match request.name.kind() {
            LockKind::Mutex if request.queued() => return self.acquire_queued_mutex(request).await,
            LockKind::Mutex => {}
            _ => return self.acquire_kind(request).await,
        }
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let key = RedisBackend::lock_key(name);
        let hex = token.to_hex_bytes();
        let px = ms(lease + drift(lease)).to_string();
        let owners = sibling_key(&key, "owners");
        let replies = self
            .on_all(
                node_timeout(lease),
                Op::Script(
                    &self.owned_set,
                    &[&key, &owners],
                    &[&hex, px.as_bytes(), request.owner_str().as_bytes()],
                ),
            )
            .await;
        let won = self.count(replies, |r| matches!(r, Reply::Simple(_)));
        match won {
            Ok(n) if n >= self.quorum => Ok(Attempt::Acquired { fence: 0 }),
            outcome => {
                // No majority: give back what this attempt took, so that the nodes it won do
                // not block the next contender for a whole lease.
                self.unlock_all(&key, &hex).await?;
                outcome.map(|_| Attempt::BUSY)
            }
        }
    }

    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let released = if name.kind() == LockKind::Mutex {
            self.unlock_all(&RedisBackend::lock_key(name), &token.to_hex_bytes())
                .await?
        } else {
            self.release_kind_all(name, token).await?
        };
        Ok(Released {
            was_held: released >= self.quorum,
            contended: false,
        })
    }

    /// Extends the key on the nodes that hold it. Only while that is a majority, the nodes
    /// that lost it (a restart without persistence) get it set again, so the hold goes on
    /// resting on all of them; a key deleted on a majority is lost, never taken back. A
    /// permit is set again in the slot the others hold it in.
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let key = RedisBackend::lock_key(name);
        let hex = token.to_hex_bytes();
        let px_ms = ms(lease + drift(lease));
        let px = px_ms.to_string();
        let timeout = node_timeout(lease);
        if name.kind() != LockKind::Mutex {
            let answers = self
                .on_each(timeout, |n| n.kind_extend(name, token, px_ms))
                .await;
            let slot = answers
                .iter()
                .find_map(|a| a.as_ref().ok().filter(|n| **n > 0).map(|n| n - 1))
                .unwrap_or(-1);
            let lost: Vec<&RedisBackend> = answers
                .iter()
                .zip(&self.nodes)
                .filter(|(a, _)| matches!(a, Ok(0)))
                .map(|(_, n)| n)
                .collect();
            if self.tally(answers.into_iter().map(|a| a.map(|n| n > 0)))? < self.quorum {
                return Ok(false);
            }
            join_all(lost.iter().map(|n| {
                tokio::time::timeout(
                    timeout,
                    n.kind_attempt(name, token, px_ms, AcquireMode::Try, false, slot, ""),
                )
            }))
            .await;
            return Ok(true);
        }
        let replies = self
            .on_all(
                timeout,
                Op::Script(
                    &self.extend,
                    &[&key, &sibling_key(&key, "owners")],
                    &[&hex, px.as_bytes()],
                ),
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

    /// Gives up the waiter's place on every node.
    async fn leave_queue(&self, name: &LockName, token: Token) -> Result<()> {
        let answers = self
            .on_each(NODE_TIMEOUT, |n| n.leave_key(name, token, false))
            .await;
        self.tally(answers.into_iter().map(|a| a.map(|()| true)))?;
        Ok(())
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let key = RedisBackend::lock_key(name);
        let answers = self.on_each(NODE_TIMEOUT, |n| n.inspect_key(&key)).await;
        let mut infos = Vec::new();
        let checked: Vec<Result<bool>> = answers
            .into_iter()
            .map(|a| {
                a.map(|info| {
                    infos.extend(info);
                    true
                })
            })
            .collect();
        self.tally(checked)?;
        Ok(self.agree(infos))
    }

    /// Removes whatever holds the key on every node (any kind, any holder).
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let answers = self
            .on_each(NODE_TIMEOUT, |n| n.force_release_key(name, false))
            .await;
        Ok(self.tally(answers)? > 0)
    }

    /// The keys under `prefix` that a majority of nodes hold.
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let answers = self
            .on_each(NODE_TIMEOUT * 10, |n| n.list_prefix(prefix))
            .await;
        let mut per_key: HashMap<String, Vec<LockInfo>> = HashMap::new();
        let mut checked = Vec::new();
        for a in answers {
            match a {
                Ok(listed) => {
                    checked.push(Ok(true));
                    for l in listed {
                        per_key.entry(l.key).or_default().push(l.info);
                    }
                }
                Err(e) => checked.push(Err(e)),
            }
        }
        self.tally(checked)?;
        Ok(per_key
            .into_iter()
            .filter_map(|(key, infos)| self.agree(infos).map(|info| ListedLock { key, info }))
            .collect())
    }
}
