//! Redis Cluster: `redis+cluster://[user:pass@]host:port[,host:port][?params]`.
//!
//! The host list names seed nodes (default port 6379), any of the cluster's nodes; the user
//! info applies to every node. The slot map comes from `CLUSTER SLOTS` at connect, and again
//! after a connection failure, a `MOVED` or a `CLUSTERDOWN`. Every request goes to the master
//! of its key's slot over the built-in client's pool for that node; all keys of one lock share
//! a slot (see `keys.rs`), so every script and pipeline runs on one node. The wire layout is the
//! single-node one.
//!
//! Redirections:
//!
//! - `MOVED slot host:port` (the slot has a new master: a failover or the end of a migration):
//!   the slot is routed there at once, the whole map is read again before the next request,
//!   and the commands from the redirected one on are sent again to the new master. A node that
//!   answers `MOVED` did not run the command.
//! - `ASK slot host:port` (the slot is migrating and the key is no longer on the source): that
//!   one command is sent to the target, after `ASKING`; the commands after it go to the slot's
//!   master again, each where its key lives. Commands run in the order they were given, so the
//!   fence script of an acquisition never runs before its `SET` took effect (one that ran
//!   early, on the source, only skipped a number).
//! - `TRYAGAIN` (a script whose keys are split between source and target, or, because the
//!   wait-queue keys of a lock nobody waits for do not exist, any script during the migration
//!   of its slot): sent again after 5 ms, doubling up to 100 ms, for at most the response
//!   timeout; then the operation fails as [`Error::Unavailable`] and the registry retries it
//!   within the caller's deadline. Migrating a slot with a few keys takes milliseconds.
//!
//! Every connection to a node the slot map names checks, with `CLUSTER MYID`, that the node
//! still has the id the map gave it: after a node dies, its address may come to another
//! server (another cluster's node, a plain Redis, a reused container address), and a request
//! routed by a map read before the failover must not take a lock there. The check fails the
//! request as unsent, and the client reads the map again from the other nodes.
//!
//! Query parameters: `min_replicas` (replicas that must acknowledge an acquisition or an
//! extension with `WAIT` before it counts; default 1 when every master has a replica at
//! connect, else 0), `replica_timeout` (how long `WAIT` may take, default 1 s),
//! `hold_slice` (see [`RedisOptions::hold_slice`](super::RedisOptions::hold_slice)) and
//! `spring_legacy_channel`. `WAIT` follows the write on the same connection, also when an
//! `ASK` sent the write to another node.
//!
//! Release notifications are plain `PUBLISH`es (as on one node, so Spring's cluster clients
//! hear them too): Redis Cluster forwards them to every node, so the backend's one pub/sub
//! connection may listen on any node; it goes to the first master of the slot map that answers,
//! and when that connection drops every waiter re-checks and the next subscription reconnects.
//! Sharded pub/sub (`SSUBSCRIBE`) would spare the cluster bus the broadcast, but it needs one
//! connection per shard and a channel per slot, and Spring does not listen there.
//!
//! What `WAIT` closes, and what it does not, is the same as under Sentinel: an acquisition or
//! extension acknowledged by `min_replicas` replicas survives the failover that promotes one
//! of them (a replica is promoted only after its master is seen failing, and Redis promotes the
//! replica with the most recent data), so the new master knows the holder and the fence. A
//! write that no replica acknowledged in time is reported as a failure although the master may
//! have applied it; the registry then gives the token back. A hold whose key the promoted
//! replica lacks is reported lost at its next renewal; a master that comes back empty before
//! its replica was promoted would wipe that replica, which Redis Cluster prevents only if the
//! node restarts with its `nodes.conf`.
//!
//! Lock kinds: the read-write lock's and the semaphore's scripts keep every key in the lock
//! key's slot (a reader's timeout keys too, see `keys::reader_prefix`), so they are routed like
//! the mutex's; their fences are floored as the mutex's are. `list` scans every master
//! ([`Cluster::masters`], [`Cluster::on_node`]) and inspects each key on its slot's master
//! ([`Cluster::run_each`]).
//!
//! TLS: `rediss+cluster://…[?ca_file=/path/ca.pem]` reaches every node over TLS, verifying
//! each certificate for the address the slot map gives (so the nodes' certificates must carry
//! the addresses they announce), against `ca_file` or else the Mozilla roots. The nodes must
//! run with `tls-cluster yes`, so that the slot map and redirections a TLS client gets name
//! their TLS ports.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::keys::hash_slot;
use super::resp::{ConnInfo, Pool, Reply, RespError};
use super::transport::{map_err, resp_err, server_err, NodeAccess};
use super::{RedisBackend, KIND};
use crate::backend::Renewal;
use crate::error::{Error, Result};

mod connect;
mod slot_map;

pub(super) use connect::connect;
use slot_map::{command_key, redirect, Redirect, Route, Shard, Topology, SLOTS, UNSERVED};

/// Redirections one request may follow before it fails: a slot that keeps moving is a cluster
/// being reconfigured faster than a client can follow.
const MAX_HOPS: usize = 16;
/// Least time between two reads of the slot map after failures: while a master is down and not
/// yet replaced, every request fails, and each need not ask the cluster again.
const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The cluster side of a [`RedisBackend`]: the slot map and one connection pool per node.
pub(super) struct Cluster {
    seeds: Vec<String>,
    /// Credentials and timeouts of every node's pool (`addr` is set per node).
    template: ConnInfo,
    /// Credentials and TLS of the URL, for pub/sub.
    access: NodeAccess,
    topology: RwLock<Arc<Topology>>,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    /// Serialises reads of the slot map; `generation` counts them, so that callers who waited
    /// for another's read do not read again.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
    generation: AtomicU64,
    /// A failure or a `MOVED` said the slot map may be out of date.
    stale: AtomicBool,
}

impl Cluster {
    /// The pool of `addr`, whose connections check the node id the slot map gives it.
    fn pool(&self, addr: &str) -> Arc<Pool> {
        let topology = self.topology();
        let id = topology.ids.get(addr).map(String::as_str);
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pools.get(addr).filter(|p| p.node_id() == id) {
            return p.clone();
        }
        let pool = Arc::new(Pool::new(ConnInfo {
            addr: addr.to_owned(),
            node_id: id.map(str::to_owned),
            ..self.template.clone()
        }));
        pools.insert(addr.to_owned(), pool.clone());
        pool
    }

    /// How many times the slot map was read: a new number is a new topology.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether every master of the slot map has a replica (the automatic `min_replicas` 1).
    pub(super) fn every_master_has_replicas(&self) -> bool {
        let t = self.topology();
        !t.masters.is_empty() && t.masters.iter().all(|m| !m.replicas.is_empty())
    }

    fn topology(&self) -> Arc<Topology> {
        self.topology
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the slot map again from the first node that answers (known masters, their
    /// replicas, then the seeds). Does nothing if another caller read it since `seen`, nor,
    /// unless `force`, if the last read (or failed attempt) is less than [`REFRESH_EVERY`] old:
    /// callers queued behind a read that failed do not each ask every node again.
    async fn refresh(&self, seen: u64, force: bool) -> Result<()> {
        let mut last = self.refreshing.lock().await;
        if self.generation.load(Ordering::Acquire) != seen {
            return Ok(());
        }
        if !force && last.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return Ok(());
        }
        let old = self.topology();
        let mut candidates: Vec<String> = Vec::new();
        for addr in old
            .masters
            .iter()
            .map(|m| &m.addr)
            .chain(old.masters.iter().flat_map(|m| &m.replicas))
            .chain(&self.seeds)
        {
            if !candidates.contains(addr) {
                candidates.push(addr.clone());
            }
        }
        let mut errors = String::new();
        for addr in &candidates {
            let pool = self.pool(addr);
            match pool.pipeline(&[[b"CLUSTER".as_slice(), b"SLOTS"]]).await {
                Ok(replies) => match replies.first() {
                    // Once the cluster is known, a plain server at one of its old addresses
                    // is a node that was replaced; at connect, a URL pointing at one.
                    Some(Reply::Error(e))
                        if e.contains("cluster support disabled") && !old.masters.is_empty() =>
                    {
                        let _ = write!(errors, "{addr}: not a cluster node any more; ");
                    }
                    Some(Reply::Error(e)) if e.contains("cluster support disabled") => {
                        return Err(Error::config(format!(
                            "redis cluster: {addr} is not a cluster node ({e}); use redis:// for a single server"
                        )))
                    }
                    Some(Reply::Error(e)) => {
                        let err = server_err(e.clone());
                        if !err.is_retryable() {
                            return Err(err);
                        }
                        let _ = write!(errors, "{addr}: {e}; ");
                    }
                    Some(r) => match Topology::parse(r, addr) {
                        Some(t) if t.served() > 0 => {
                            self.install(t);
                            *last = Some(Instant::now());
                            return Ok(());
                        }
                        _ => {
                            let _ = write!(errors, "{addr}: serves no slots yet; ");
                        }
                    },
                    None => {}
                },
                Err(e) => {
                    pool.clear();
                    let err = resp_err(e);
                    if !err.is_retryable() {
                        return Err(err);
                    }
                    let _ = write!(errors, "{addr}: {err}; ");
                }
            }
        }
        *last = Some(Instant::now());
        Err(Error::unavailable(
            KIND,
            format!(
                "no cluster node gave a slot map: {}",
                errors.trim_end_matches("; ")
            ),
        ))
    }

    fn install(&self, t: Topology) {
        // Pools of nodes that left the cluster would never be used again.
        {
            let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            // So do those that checked another node id than the new map gives.
            pools.retain(|addr, pool| {
                (self.seeds.contains(addr)
                    || t.masters
                        .iter()
                        .any(|m| &m.addr == addr || m.replicas.contains(addr)))
                    && pool
                        .node_id()
                        .is_none_or(|id| t.ids.get(addr).is_some_and(|n| n == id))
            });
        }
        *self.topology.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(t);
        self.stale.store(false, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Routes `slot` to `addr` now, as a `MOVED` said; the whole map is read at the next
    /// request.
    fn learn(&self, slot: usize, addr: &str) {
        let mut guard = self.topology.write().unwrap_or_else(|e| e.into_inner());
        let mut t = Topology {
            slots: guard.slots.clone(),
            masters: guard
                .masters
                .iter()
                .map(|m| Shard {
                    addr: m.addr.clone(),
                    replicas: m.replicas.clone(),
                })
                .collect(),
            ids: guard.ids.clone(),
        };
        let i = t.master_index(addr);
        t.slots[slot] = i;
        *guard = Arc::new(t);
        drop(guard);
        self.stale.store(true, Ordering::Release);
    }

    /// Reads the slot map again if a failure made it stale, at most every [`REFRESH_EVERY`].
    async fn refresh_if_stale(&self) {
        if self.stale.load(Ordering::Acquire) {
            // A failed read leaves the old map; the request then meets the failure itself.
            let _ = self
                .refresh(self.generation.load(Ordering::Acquire), false)
                .await;
        }
    }

    /// The master of `slot` (any master for a request without keys).
    fn owner(&self, slot: Option<usize>) -> Result<String> {
        let t = self.topology();
        let index = match slot {
            Some(s) => t.slots[s],
            None if t.masters.is_empty() => UNSERVED,
            None => 0,
        };
        match t.masters.get(usize::from(index)) {
            Some(m) => Ok(m.addr.clone()),
            None => {
                self.stale.store(true, Ordering::Release);
                Err(Error::unavailable(
                    KIND,
                    format!(
                        "no master serves hash slot {} (CLUSTERDOWN)",
                        slot.unwrap_or(0)
                    ),
                ))
            }
        }
    }

    /// Sends `cmds` (all of one hash slot) to that slot's master, following redirections (see
    /// the module docs), with `wait` (a `WAIT` command) after each part sent. Returns the
    /// replies in order and the smallest `WAIT` reply of the parts that ran commands.
    pub(super) async fn run(
        &self,
        cmds: &[&[&[u8]]],
        wait: Option<&[&[u8]]>,
    ) -> Result<(Vec<Reply>, Option<Reply>)> {
        self.refresh_if_stale().await;
        let slot = cmds
            .iter()
            .find_map(|c| command_key(c))
            .map(|k| usize::from(hash_slot(k)));
        let give_up = Instant::now() + self.template.response_timeout;
        let mut backoff = Duration::from_millis(5);
        let mut out: Vec<Reply> = Vec::with_capacity(cmds.len());
        let mut acked: Option<Reply> = None;
        let mut route = Route::Owner;
        let mut resent = false;
        for _ in 0..MAX_HOPS {
            let rest = &cmds[out.len()..];
            if rest.is_empty() {
                return Ok((out, acked));
            }
            let (addr, asking, part) = match &route {
                Route::Owner => (self.owner(slot)?, false, rest),
                Route::Node(a) => (a.clone(), false, rest),
                Route::Ask(a) => (a.clone(), true, &rest[..1]),
            };
            let mut send: Vec<&[&[u8]]> = Vec::with_capacity(part.len() + 2);
            if asking {
                send.push(&[b"ASKING"]);
            }
            send.extend_from_slice(part);
            send.extend(wait);
            let pool = self.pool(&addr);
            let mut replies = match pool.pipeline(&send).await {
                Ok(r) => r,
                Err(RespError::Unsent(e)) if !resent && matches!(route, Route::Owner) => {
                    // Nothing reached the node (it is gone: a failover). If the map names
                    // another master now, the request goes there once.
                    pool.clear();
                    resent = true;
                    let _ = self
                        .refresh(self.generation.load(Ordering::Acquire), true)
                        .await;
                    if self.owner(slot)? == addr {
                        return Err(resp_err(RespError::Unsent(e)));
                    }
                    continue;
                }
                Err(e) => {
                    // The node may be gone (a failover): read the map again before the next
                    // request. Whether this one ran is unknown, so it is not sent again.
                    pool.clear();
                    self.stale.store(true, Ordering::Release);
                    return Err(resp_err(e));
                }
            };
            let waited = if wait.is_some() { replies.pop() } else { None };
            if asking {
                replies.remove(0);
            }
            let cut = replies
                .iter()
                .position(|r| redirect(r, &addr).is_some())
                .unwrap_or(replies.len());
            if cut > 0 {
                acked = match (acked, waited) {
                    (Some(Reply::Int(a)), Some(Reply::Int(b))) => Some(Reply::Int(a.min(b))),
                    (Some(a @ Reply::Error(_)), _) => Some(a),
                    (_, w) => w,
                };
            }
            let next = replies.get(cut).and_then(|r| redirect(r, &addr));
            let tail = replies.split_off(cut);
            if replies
                .iter()
                .any(|r| matches!(r, Reply::Error(e) if e.starts_with("CLUSTERDOWN")))
            {
                self.stale.store(true, Ordering::Release);
            }
            out.extend(replies);
            route = match next {
                None => Route::Owner,
                Some(Redirect::Moved(s, to)) => {
                    self.learn(s, &to);
                    Route::Node(to)
                }
                Some(Redirect::Ask(to)) => Route::Ask(to),
                Some(Redirect::TryAgain) => {
                    if Instant::now() + backoff > give_up {
                        // Still migrating: the caller gets TRYAGAIN (Unavailable) for the rest.
                        out.extend(tail);
                        out.resize_with(cmds.len(), || Reply::Error("TRYAGAIN".into()));
                        return Ok((out, acked));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                    route
                }
            };
        }
        Err(Error::unavailable(
            KIND,
            format!("more than {MAX_HOPS} redirections for hash slot {slot:?}"),
        ))
    }

    /// The address of every master, for what looks at all of them (`list`'s `SCAN`). Fails
    /// as [`Error::Unavailable`] while a slot has no master (a failover under way): a scan
    /// would miss its keys.
    pub(super) async fn masters(&self) -> Result<Vec<String>> {
        self.refresh_if_stale().await;
        let t = self.topology();
        if t.served() < SLOTS || t.masters.is_empty() {
            self.stale.store(true, Ordering::Release);
            return Err(Error::unavailable(
                KIND,
                format!(
                    "{} of {SLOTS} hash slots have no master (CLUSTERDOWN)",
                    SLOTS - t.served()
                ),
            ));
        }
        Ok(t.masters.iter().map(|m| m.addr.clone()).collect())
    }

    /// One command on node `addr`, whatever its keys (`SCAN` of that node).
    pub(super) async fn on_node(&self, addr: &str, cmd: &[&[u8]]) -> Result<Reply> {
        let pool = self.pool(addr);
        match pool.pipeline(&[cmd]).await {
            Ok(mut replies) => replies
                .pop()
                .ok_or_else(|| Error::unavailable(KIND, "missing reply")),
            Err(e) => {
                pool.clear();
                self.stale.store(true, Ordering::Release);
                Err(resp_err(e))
            }
        }
    }

    /// Sends `cmds`, which may be of different hash slots, each to the master of its slot: one
    /// pipeline per master, all at once; a command redirected (`MOVED`, `ASK`, `TRYAGAIN`), or
    /// one whose node failed, goes again on its own through [`Self::run`]. Only for commands
    /// that may run twice (reads: `list`'s inspections). Replies come back in order.
    pub(super) async fn run_each(&self, cmds: &[&[&[u8]]]) -> Result<Vec<Reply>> {
        self.refresh_if_stale().await;
        let t = self.topology();
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut alone: Vec<usize> = Vec::new();
        for (i, cmd) in cmds.iter().enumerate() {
            let index = command_key(cmd).map(|k| t.slots[usize::from(hash_slot(k))]);
            match index.and_then(|m| t.masters.get(usize::from(m))) {
                Some(m) => groups.entry(m.addr.clone()).or_default().push(i),
                None => alone.push(i),
            }
        }
        let sent = join_all(groups.iter().map(|(addr, group)| async move {
            let part: Vec<&[&[u8]]> = group.iter().map(|&i| cmds[i]).collect();
            let pool = self.pool(addr);
            let replies = pool.pipeline(&part).await;
            if replies.is_err() {
                pool.clear();
                self.stale.store(true, Ordering::Release);
            }
            (addr, group, replies)
        }))
        .await;
        let mut out: Vec<Option<Reply>> = vec![None; cmds.len()];
        for (addr, group, replies) in sent {
            match replies {
                Ok(replies) if replies.len() == group.len() => {
                    for (&i, reply) in group.iter().zip(replies) {
                        if redirect(&reply, addr).is_some() {
                            alone.push(i);
                        } else {
                            out[i] = Some(reply);
                        }
                    }
                }
                _ => alone.extend(group),
            }
        }
        for i in alone {
            let (mut replies, _) = self.run(&cmds[i..=i], None).await?;
            out[i] = replies.pop();
        }
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Reply::Error("missing reply".into())))
            .collect())
    }

    /// A pub/sub connection to the first node of the slot map that accepts one: Redis
    /// Cluster forwards every `PUBLISH` to every node.
    pub(super) async fn pubsub(&self) -> Result<redis::aio::PubSub> {
        let t = self.topology();
        let mut last = None;
        for addr in t
            .masters
            .iter()
            .map(|m| &m.addr)
            .chain(t.masters.iter().flat_map(|m| &m.replicas))
        {
            let client = self.access.client(addr, 0)?;
            let connect = client.get_async_pubsub();
            match tokio::time::timeout(self.template.connect_timeout, connect).await {
                Ok(Ok(ps)) => return Ok(ps),
                Ok(Err(e)) => last = Some(map_err(e)),
                Err(_) => last = Some(Error::unavailable(KIND, format!("{addr}: timed out"))),
            }
        }
        self.stale.store(true, Ordering::Release);
        Err(last.unwrap_or_else(|| Error::unavailable(KIND, "no cluster node to listen on")))
    }
}

/// Renews `batch` with one call per hash slot (the keys of one script must share a slot), all
/// slots at once; the results come back in the batch's order.
pub(super) async fn extend_by_slot(backend: &RedisBackend, batch: &[Renewal]) -> Vec<Result<bool>> {
    let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, r) in batch.iter().enumerate() {
        let slot = hash_slot(RedisBackend::lock_key(&r.name).as_bytes());
        groups.entry(slot).or_default().push(i);
    }
    let results = join_all(groups.values().map(|group| async move {
        let renewals: Vec<Renewal> = group.iter().map(|&i| batch[i].clone()).collect();
        backend.extend_batch(&renewals).await
    }))
    .await;
    let mut out: Vec<Option<Result<bool>>> = (0..batch.len()).map(|_| None).collect();
    for (group, results) in groups.values().zip(results) {
        for (&i, r) in group.iter().zip(results) {
            out[i] = Some(r);
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::backend(KIND, "short renewal reply"))))
        .collect()
}
