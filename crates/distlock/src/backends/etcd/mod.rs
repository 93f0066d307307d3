//! etcd backend: the layout of etcd's own `clientv3/concurrency.Mutex`, so that `etcdctl lock`,
//! the Go client's `concurrency.Mutex` and distlock exclude each other on the same names.
//!
//! | what | layout |
//! |---|---|
//! | mutex contender | key `<prefix>/<key>/<lease id in lowercase hex>`, named after the lease it is created on; value: the owner token (32 hex digits) and the holder's description, `<token>;owner=<description>` |
//! | reader, writer, permit | keys `<prefix>/<key>/read-<lease id>`, `…/write-<lease id>`, `…/sem-<lease id>` in the same directory, named after the session lease they are attached to (as the mutex's); value: as the mutex's (a permit's: `<token>;owner=<description>;permits=<n>`) |
//! | owner | the description in the value (`%` and `;` escaped as `%25`, `%3B`); a value without it (an older distlock's) or empty (`etcdctl lock`'s) is unknown, another client's value is shown as it is; see `kinds.rs` |
//! | holder | a mutex or writer with the lowest create revision under `<prefix>/<key>/`; a reader with no older key but readers'; a permit with no older key but permits' and fewer than `n` older permits |
//! | waiting | each waiter watches only what it waits for: a mutex or writer the key created just before it (FIFO, no herd), a reader or permit the nearest older key of another kind, a permit waiting for its turn the deletions of the permits' keys |
//! | fence | the holder key's create revision: cluster-wide, strictly increasing (also across kinds), the same number every etcd client sees |
//! | election candidate | key `<prefix>/<name>/<lease id hex>` (etcd's `concurrency.Election`, `etcdctl elect <prefix>/<name>`); value: the candidate's description alone; the lowest create revision leads (see `LockName::for_election`) |
//! | lease | one etcd lease per backend instance and lease length (a session, like `concurrency.Session`), kept alive in the background; a waiting key is attached to a short waiter lease until it reaches the head |
//!
//! `etcdctl lock lock/voucher:42` and `LockRegistry` with prefix `lock` on key `voucher:42`
//! contend for the same lock. etcd has no standard read-write lock or semaphore; ours keep
//! their keys in the same directory, so `etcdctl lock` (which waits for every key there) waits
//! for our readers, writers and permits, and ours count every key that is not a reader's
//! (or not a permit's) as exclusive, so they wait for `etcdctl lock`, and a waiting one keeps
//! later readers and permits out. The number of permits is in the permit keys' values: a key
//! of its own there would look to `etcdctl lock` like a holder that never leaves. See
//! `kinds.rs`.
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
//! A waiter's key stays in the queue (with its create revision, its place) while it waits,
//! attached to a short lease of its own ([`EtcdOptions::waiter_ttl`], 2 s, URL
//! `waiter_ttl=10s`), so that a waiter that dies leaves the queue within that TTL whatever lease
//! it asked for. Each such lease is kept alive every third of its TTL: with many waiters those
//! keep-alives are most of the server's work, and a longer `waiter_ttl` trades a slower exit
//! of a dead waiter for fewer of them (see the waiters benchmark). When it reaches the
//! head it puts its key again with a session lease of its lease's length (a put keeps the key's
//! name and create revision, so its place) before it reports the lock acquired, in the same
//! transaction that finds no older key in the directory. The
//! waiter watches the key created just before its own, starting at the server's current
//! revision, and then checks once more that this key still exists: a watch started at an
//! older revision would be delivered by etcd 3.4's catch-up loop, which runs only every
//! 100 ms. A waiter far back in the queue (32 or more contenders ahead), whose predecessor
//! goes only after many hand-overs, instead watches from the revision of the read that found
//! the predecessor and skips the check, which would range the whole directory once more.
//! A release that leaves other keys in the directory makes this instance's next waiting try
//! of the lock answer busy without asking (the queued attempt that follows asks). Whenever a wait ends, the next attempt confirms in one linearizable read that the
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
//! an `etcd://` URL is an [`Error::InvalidConfig`]. `waiter_ttl=<duration>` sets
//! [`EtcdOptions::waiter_ttl`] (see Waiting).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::backend::{
    detach_on_drop, detached, AcquireRequest, Attempt, Backend, Capabilities, ListedLock, LockInfo,
    LockName, ReleaseSubscription, Released, Renewal, Token,
};
use crate::backends::contenders::Locked;
use crate::error::{Error, Result};

mod acquire;
mod address;
mod client;
mod kinds;
mod options;
mod pb;
mod pool;
mod queue;
mod renew;
mod rpc_error;
mod session;
mod state;
#[cfg(test)]
mod tests;
mod unary;
mod watch;

use self::address::{tls_settings, ParsedUrl};
use self::client::{Client, Settings};
use self::kinds::{queued, Queued};
pub use self::options::EtcdOptions;
use self::options::{KIND, ORPHAN_GRACE, WAITER_IDLE};
use self::rpc_error::{is_connect_error, map_err, RpcError};
use self::state::{Shared, SubKeep};
use self::watch::{run_watch_hub, WatchHub};
use crate::backends::contenders::{self, Stage, Table};

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

impl EtcdBackend {
    /// Connects to the cluster named by `url` with default options. Fails with
    /// [`Error::InvalidConfig`] on a malformed URL, [`Error::Backend`] on a wrong password and
    /// [`Error::Unavailable`] when no server can be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, EtcdOptions::default()).await
    }

    /// Connects with explicit options.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect_with(url: &str, mut options: EtcdOptions) -> Result<Self> {
        let parsed = ParsedUrl::parse(url)?;
        if let Some(t) = parsed.waiter_ttl {
            options.waiter_ttl = t;
        }
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
            slots: Table::default(),
            handed: Mutex::new(HashMap::new()),
        });
        tokio::spawn(run_watch_hub(client, watch_rx));
        shared.slots.reaper().run(&shared);
        Ok(EtcdBackend { shared })
    }

    /// One put of `value` at `key` (no lease) through the backend's gRPC client: the
    /// baseline of the benchmark workers. Not part of the API.
    ///
    /// # Cancel safety
    /// Not cancel safe in effect: a dropped call may or may not have written.
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
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    #[doc(hidden)]
    pub async fn raw_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let resp = self.shared.range(pb::range_key(key.as_bytes())).await?;
        Ok(resp.kvs.into_iter().next().map(|kv| kv.value))
    }

    async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let queued = request.queued();
        if !queued && request.waits && self.shared.expects_busy(name) {
            // The queued attempt that follows at once asks the server; this try would put a
            // key, range the whole queue and delete the key again to learn the same.
            return Ok(Attempt::Busy {
                retry_after: None,
                ahead: None,
            });
        }
        let owner = request.owner_str().to_owned();
        let slot = self.shared.slot_for(token);
        let shared = self.shared.clone();
        let name = name.clone();
        // Carried on in a task of its own if the caller gives up mid-request: the outcome is
        // still recorded, and a release that follows finds it (it waits for the entry lock).
        // The lock is taken before the attempt starts: a release issued by a caller that gave
        // up right after this returned must not run first and let the attempt create a key
        // nobody gives back.
        let mut e = slot.entry.clone().lock_owned().await;
        detach_on_drop(KIND, async move {
            let res = shared
                .attempt_locked(&slot, &mut e, name, token, lease, queued, &owner)
                .await;
            e.failed_at = res.is_err().then(Instant::now);
            // Every slot is planned: a key nobody comes back for is deleted, an idle slot
            // forgotten (`Reap::due` says when, per stage).
            let wait = if res.is_err() {
                ORPHAN_GRACE
            } else {
                WAITER_IDLE
            };
            shared.slots.reap_by(token, Instant::now() + wait);
            shared.slots.reaper().run(&shared);
            res
        })
        .await
    }

    /// Deletes the key of `token` (released or given up); returns (was held, key deleted).
    async fn finish(&self, token: Token) -> Result<(bool, bool)> {
        let Some(slot) = self.shared.slots.get(token) else {
            return Ok((false, false));
        };
        let shared = self.shared.clone();
        detach_on_drop(KIND, async move {
            let mut e = slot.entry.lock().await;
            shared.finish_locked(&slot, &mut e, token).await
        })
        .await
    }
}

impl contenders::View for EtcdBackend {
    type Entry = kinds::Key;

    async fn holders(&self, name: &LockName) -> Result<Option<contenders::Holders<kinds::Key>>> {
        Ok(contenders::Holders::of(self.shared.all_of(name).await?))
    }

    /// The longest TTL of the holders' session leases (whole seconds).
    async fn remaining(&self, h: &contenders::Holders<kinds::Key>) -> Option<Duration> {
        let mut leases: Vec<i64> = h.held.iter().map(|q| q.entry.lease).collect();
        leases.retain(|l| *l != 0);
        leases.sort_unstable();
        leases.dedup();
        let ttls = leases
            .iter()
            .map(|l| self.shared.client.lease_time_to_live(*l));
        let ttls = futures_util::future::join_all(ttls).await;
        let ttls = ttls
            .into_iter()
            .filter_map(|r| u64::try_from(r.ok()?.ttl).ok());
        ttls.max().map(Duration::from_secs)
    }

    /// Deletes the key if it is still the one created at its fence.
    async fn delete(&self, q: &Queued) -> Result<bool> {
        let key = &q.entry.key;
        let cond = vec![pb::create_revision_is(key, q.fence)];
        let txn = pb::txn(cond, vec![pb::op_delete(key)], vec![]);
        Ok(self.shared.txn(txn).await?.succeeded)
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(KIND)
            .notifies_release(true)
            .owners(true)
            .fifo(true)
            .all_kinds()
    }

    /// Puts the token's key under the lock's prefix. A [`Try`](crate::AcquireMode::Try) attempt
    /// deletes it again unless it has the lowest create revision; a
    /// [`Queue`](crate::AcquireMode::Queue) attempt keeps it as the token's place in line.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.attempt(request).await
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

    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        crate::backends::contenders::extend_one(self, KIND, name, token, lease).await
    }

    async fn extend_many(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        self.shared.extend_batch(batch).await
    }

    /// Fires when the waiter's predecessor key goes (only the next contender is woken).
    async fn subscribe(&self, _name: &LockName, waiter: Token) -> Result<ReleaseSubscription> {
        let token = waiter;
        let slot = self.shared.slot_for(token);
        let alive = Arc::new(());
        *slot.sub.locked() = Arc::downgrade(&alive);
        let sub = ReleaseSubscription::new(
            slot.signal.clone(),
            Some(Box::new(SubKeep {
                alive: Some(alive),
                slot: Arc::downgrade(&slot),
                shared: Arc::downgrade(&self.shared),
                token,
            })),
        );
        // Watch the known predecessor now; the registry looks again right after.
        let shared = self.shared.clone();
        detached(KIND, String::new, None, async move {
            let mut e = slot.entry.lock().await;
            e.touched = Some(Instant::now());
            if e.stage != Stage::Queued {
                return Ok(());
            }
            let Some(pred) = e.pred.clone() else {
                return Ok(());
            };
            if !slot.watches(&pred) {
                shared.watch_pred(&slot, pred, 0).await?;
            }
            Ok(())
        })
        .await?;
        Ok(sub)
    }

    /// Deletes the holders' keys of `name` (of every kind), whoever holds them, as an
    /// operator (or a fault) would. Returns whether there was one.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        contenders::force_release(self, name).await
    }

    /// The locks under `<prefix>/`: one range of the whole prefix, grouped by lock directory.
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let s = &self.shared;
        let root = format!("{prefix}/");
        let resp = s
            .range(queue::with_values(pb::range_by_create(
                root.as_bytes(),
                pb::range_request::SortOrder::Ascend,
            )))
            .await?;
        let mut dirs: Vec<(Vec<u8>, Vec<pb::KeyValue>)> = Vec::new();
        let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
        for kv in resp.kvs {
            let Some(slash) = kv.key.iter().rposition(|b| *b == b'/') else {
                continue;
            };
            let dir = kv.key[..=slash].to_vec();
            if dir.len() <= root.len() {
                continue; // a key right under the prefix names no lock of it
            }
            let i = *at.entry(dir.clone()).or_insert_with(|| {
                dirs.push((dir, Vec::new()));
                dirs.len() - 1
            });
            dirs[i].1.push(kv);
        }
        let mut out = Vec::new();
        for (dir, kvs) in dirs {
            let Some(h) = contenders::Holders::of(queued(&dir, &kvs, false)) else {
                continue;
            };
            let info = h.info(contenders::View::remaining(self, &h).await);
            let key = &dir[root.len()..dir.len() - 1];
            out.push(ListedLock {
                key: String::from_utf8_lossy(key).into_owned(),
                info,
            });
        }
        Ok(out)
    }

    /// The holders' kind and number, the waiters, the highest holder's create revision and
    /// the longest TTL of the holders' session leases (whole seconds).
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        contenders::inspect(self, name).await
    }
}
