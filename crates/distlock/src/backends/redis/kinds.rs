//! Read-write locks in Redisson's `RReadWriteLock` layout and semaphores in distlock's own
//! layout, both as a hash at the lock key (so a Spring or `SET NX` client, and our own mutex,
//! find the key taken), plus what looks at a key whatever holds it: inspection and listing.
//! The scripts are in `scripts.rs` (`KIND_ACQUIRE`, `KIND_RELEASE`, `KIND_EXTEND`, `INSPECT`);
//! the Redlock backend runs the same ones on each of its nodes.

use std::collections::BTreeSet;
use std::time::Duration;

use super::keys::{is_bookkeeping, reader_prefix, redisson_prefix, sibling_key};
use super::resp::Reply;
use super::scripts::Lua;
use super::transport::server_err;
use super::{RedisBackend, KIND};
use crate::backend::{
    AcquireMode, ListedLock, LockInfo, LockKind, LockName, Owner, Token, UNKNOWN_OWNER,
};
use crate::error::{Error, Result};

/// Scripts looked at per pipeline when listing.
const LIST_CHUNK: usize = 256;

/// What one attempt of a read, write or permit hold found on one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KindAttempt {
    /// Taken (or already ours): the fence, and a permit's slot (0 for the other kinds).
    Acquired { fence: u64, slot: i64 },
    /// Held by others, or an earlier waiter goes first.
    Busy { retry_after: Option<Duration> },
    /// The semaphore's holders use this other number of permits.
    Disagree { permits: i64 },
}

/// The scripts' letter for a kind (never called for the mutex, whose scripts are its own).
pub(super) fn letter(kind: LockKind) -> &'static [u8] {
    match kind {
        LockKind::Read => b"r",
        LockKind::Write => b"w",
        _ => b"s",
    }
}

/// The error of a permit taker whose number of permits is not its fellow holders'.
pub(super) fn disagreement(name: &LockName, theirs: i64) -> Error {
    let mine = match name.kind() {
        LockKind::Semaphore { permits } => permits,
        _ => 0,
    };
    Error::config(format!(
        "semaphore {} has holders with {theirs} permits; this one asks for {mine} permits",
        crate::ShortKey(name.key())
    ))
}

fn flag(on: bool) -> &'static [u8] {
    if on {
        b"1"
    } else {
        b"0"
    }
}

/// The six keys of the kind scripts: lock, fence, queue, waiter places, reader timeout prefix
/// (see [`reader_prefix`]; `cluster` on Redis Cluster), owners. All six share the lock key's
/// hash slot.
pub(super) fn script_keys(key: &str, cluster: bool) -> [String; 6] {
    [
        key.to_owned(),
        sibling_key(key, "fence"),
        sibling_key(key, "queue"),
        sibling_key(key, "waiters"),
        reader_prefix(key, cluster),
        sibling_key(key, "owners"),
    ]
}

/// Redisson's channel of the read-write lock at `key`.
pub(super) fn rw_channel(key: &str) -> String {
    format!("redisson_rwlock:{}", redisson_prefix(key))
}

/// What `INSPECT` answered, or `None` for a free key.
pub(super) fn parse_info(reply: &Reply) -> Result<Option<LockInfo>> {
    let bad = || Error::backend(KIND, format!("unexpected inspect reply {reply:?}"));
    let Reply::Array(Some(items)) = reply else {
        return Err(bad());
    };
    let (pttl, fence, kind, holders, waiters, permits, owners) = match items.as_slice() {
        [p, f, k, h, w, n, o] => (p, f, k, h, w, n, Some(o)),
        [p, f, k, h, w, n] => (p, f, k, h, w, n, None),
        _ => return Err(bad()),
    };
    let int = |r: &Reply| r.int().ok_or_else(bad);
    let pttl = int(pttl)?;
    if pttl == -2 {
        return Ok(None);
    }
    let kind = match kind {
        Reply::Bulk(Some(k)) => match k.as_slice() {
            b"read" => LockKind::Read,
            b"write" => LockKind::Write,
            b"semaphore" => LockKind::Semaphore {
                permits: u32::try_from(int(permits)?).unwrap_or(0),
            },
            _ => LockKind::Mutex,
        },
        _ => return Err(bad()),
    };
    let count = |r: &Reply| int(r).map(|n| u32::try_from(n).unwrap_or(0));
    Ok(Some(
        LockInfo::new(
            u64::try_from(int(fence)?).ok(),
            u64::try_from(pttl).ok().map(Duration::from_millis),
        )
        .with_kind(kind)
        .with_holders(count(holders)?)
        .with_waiters(count(waiters)?)
        .with_owners(match owners {
            Some(Reply::Array(Some(owners))) => owners
                .iter()
                .map(|o| match o {
                    Reply::Bulk(Some(b)) => Owner::shown(b),
                    _ => UNKNOWN_OWNER.to_owned(),
                })
                .collect(),
            _ => Vec::new(),
        }),
    ))
}

/// `prefix` with the glob characters of `SCAN ... MATCH` escaped.
fn glob_escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 4);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl RedisBackend {
    /// One attempt at a read, write or permit hold on this server. `lease_ms` is the lease
    /// the keys get (Redlock adds its drift); `fifo` is false on Redlock (see
    /// `scripts::KIND_ACQUIRE`); `slot` is the permit slot asked for (`-1`: the lowest free);
    /// `owner` is the holder's description to record (empty: keep what is recorded).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn kind_attempt(
        &self,
        name: &LockName,
        token: Token,
        lease_ms: u64,
        mode: AcquireMode,
        fifo: bool,
        slot: i64,
        owner: &str,
    ) -> Result<KindAttempt> {
        let keys = script_keys(&Self::lock_key(name), self.cluster.is_some());
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let hex = token.to_hex_bytes();
        let member = self.member(token);
        let ttl = match mode {
            AcquireMode::Try => 0,
            AcquireMode::Queue => self.waiter_ttl_ms,
        };
        let (lease, ttl, slot) = (lease_ms.to_string(), ttl.to_string(), slot.to_string());
        let permits = match name.kind() {
            LockKind::Semaphore { permits } => permits,
            _ => 0,
        }
        .to_string();
        let reply = self
            .eval_replicated(
                &self.scripts.kind_acquire,
                &keys,
                &[
                    &hex,
                    lease.as_bytes(),
                    ttl.as_bytes(),
                    &member,
                    letter(name.kind()),
                    flag(fifo),
                    permits.as_bytes(),
                    slot.as_bytes(),
                    owner.as_bytes(),
                ],
            )
            .await?;
        match reply.ints().as_deref() {
            Some(&[1, fence, slot]) => {
                // A writer's hand-over whose message came while this attempt ran is
                // superseded by it.
                self.grants.forget(&hex);
                let fence = u64::try_from(fence)
                    .map_err(|_| Error::backend(KIND, format!("fence {fence} is negative")))?;
                Ok(KindAttempt::Acquired { fence, slot })
            }
            Some(&[0, retry, floor]) => {
                if fifo && mode == AcquireMode::Queue {
                    self.grants_busy(&hex, floor);
                }
                Ok(KindAttempt::Busy {
                    retry_after: u64::try_from(retry).ok().map(Duration::from_millis),
                })
            }
            Some(&[2, permits]) => Ok(KindAttempt::Disagree { permits }),
            _ => Err(Error::backend(KIND, format!("unexpected reply {reply:?}"))),
        }
    }

    /// Releases a read, write or permit hold; true when it was still live. `grants` is false
    /// on Redlock (no hand-over to a waiter on one node).
    pub(super) async fn kind_release(
        &self,
        name: &LockName,
        token: Token,
        grants: bool,
    ) -> Result<bool> {
        let letter = letter(name.kind());
        self.eval_ending(
            &self.scripts.kind_release,
            name,
            &[&token.to_hex_bytes(), letter],
            grants,
        )
        .await
    }

    /// Runs a script that ends holds of `name` and tells its waiters: the arguments are
    /// `first`, then the channel, the wake prefix, the legacy flag, the read-write channel and
    /// `grants`; true when the script ended something.
    async fn eval_ending(
        &self,
        script: &Lua,
        name: &LockName,
        first: &[&[u8]],
        grants: bool,
    ) -> Result<bool> {
        let key = Self::lock_key(name);
        let keys = script_keys(&key, self.cluster.is_some());
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (channel, wake, rw) = (
            Self::channel(name),
            Self::wake_prefix(name),
            rw_channel(&key),
        );
        let mut args = first.to_vec();
        args.extend_from_slice(&[
            channel.as_bytes(),
            wake.as_bytes(),
            self.legacy(),
            rw.as_bytes(),
            flag(grants),
        ]);
        let r = self.eval(script, &keys, &args).await?;
        Ok(r.int() == Some(1))
    }

    /// Extends one read, write or permit hold: 0 when it is no longer held, else 1 (a
    /// permit: its slot + 1).
    pub(super) async fn kind_extend(
        &self,
        name: &LockName,
        token: Token,
        lease_ms: u64,
    ) -> Result<i64> {
        let key = Self::lock_key(name);
        let prefix = reader_prefix(&key, self.cluster.is_some());
        let owners = sibling_key(&key, "owners");
        let lease = lease_ms.to_string();
        let r = self
            .eval_replicated(
                &self.scripts.kind_extend,
                &[&key, &prefix, &owners],
                &[&token.to_hex_bytes(), lease.as_bytes(), letter(name.kind())],
            )
            .await?;
        match r.ints().as_deref() {
            Some(&[n]) => Ok(n),
            _ => Err(Error::backend(KIND, format!("unexpected reply {r:?}"))),
        }
    }

    /// Removes whatever holds the key (see `scripts::FORCE_RELEASE`).
    pub(super) async fn force_release_key(&self, name: &LockName, grants: bool) -> Result<bool> {
        self.eval_ending(&self.scripts.force_release, name, &[], grants)
            .await
    }

    /// Gives up `token`'s place in the key's wait queue (see `scripts::LEAVE`).
    pub(super) async fn leave_key(
        &self,
        name: &LockName,
        token: Token,
        grants: bool,
    ) -> Result<()> {
        let key = Self::lock_key(name);
        let (queue, waiters) = Self::queue_keys(&key);
        let (channel, wake, member) = (
            Self::channel(name),
            Self::wake_prefix(name),
            self.member(token),
        );
        self.eval(
            &self.scripts.leave,
            &[
                &key,
                &sibling_key(&key, "fence"),
                &queue,
                &waiters,
                &sibling_key(&key, "owners"),
            ],
            &[
                &member,
                wake.as_bytes(),
                channel.as_bytes(),
                self.legacy(),
                flag(grants),
            ],
        )
        .await?;
        Ok(())
    }

    /// What holds the lock key, whatever its kind.
    pub(super) async fn inspect_key(&self, key: &str) -> Result<Option<LockInfo>> {
        let keys = script_keys(key, self.cluster.is_some());
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let r = self.eval(&self.scripts.inspect, &keys, &[]).await?;
        parse_info(&r)
    }

    /// Every key held under `prefix`: `SCAN` for `<prefix>:*` (glob characters escaped, so no
    /// other prefix's keys) on the server, or on every master of a Redis Cluster, bookkeeping
    /// keys left out, each key inspected (in pipelines of [`LIST_CHUNK`] scripts; on Cluster
    /// each script goes to its slot's master); free keys are left out.
    pub(super) async fn list_prefix(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let pattern = format!("{}:*", glob_escape(prefix));
        let head = format!("{prefix}:");
        let mut found = BTreeSet::new();
        let nodes: Vec<Option<String>> = match &self.cluster {
            Some(cluster) => cluster.masters().await?.into_iter().map(Some).collect(),
            None => vec![None],
        };
        for node in &nodes {
            let mut cursor = b"0".to_vec();
            loop {
                let scan: &[&[u8]] = &[
                    b"SCAN",
                    &cursor,
                    b"MATCH",
                    pattern.as_bytes(),
                    b"COUNT",
                    b"1000",
                ];
                let reply = match (node, &self.cluster) {
                    (Some(addr), Some(cluster)) => cluster.on_node(addr, scan).await?,
                    _ => self.request(scan).await?,
                };
                let (next, keys) = match reply {
                    Reply::Array(Some(mut parts)) if parts.len() == 2 => {
                        match (parts.pop(), parts.pop()) {
                            (Some(Reply::Array(Some(keys))), Some(Reply::Bulk(Some(next)))) => {
                                (next, keys)
                            }
                            other => {
                                return Err(Error::backend(
                                    KIND,
                                    format!("unexpected SCAN reply {other:?}"),
                                ))
                            }
                        }
                    }
                    Reply::Error(e) => return Err(server_err(e)),
                    r => return Err(Error::backend(KIND, format!("unexpected SCAN reply {r:?}"))),
                };
                for k in keys {
                    let Reply::Bulk(Some(k)) = k else { continue };
                    let Ok(k) = String::from_utf8(k) else {
                        continue;
                    };
                    let Some(user) = k.strip_prefix(&head) else {
                        continue;
                    };
                    if crate::backend::validate_key(user).is_ok() && !is_bookkeeping(&k, prefix) {
                        found.insert(k);
                    }
                }
                if next == b"0" {
                    break;
                }
                cursor = next;
            }
        }
        let found: Vec<String> = found.into_iter().collect();
        let mut listed = Vec::new();
        for chunk in found.chunks(LIST_CHUNK) {
            let keys: Vec<[String; 6]> = chunk
                .iter()
                .map(|k| script_keys(k, self.cluster.is_some()))
                .collect();
            let calls: Vec<(&Lua, Vec<&[u8]>, usize)> = keys
                .iter()
                .map(|k| {
                    let args: Vec<&[u8]> = k.iter().map(|s| s.as_bytes()).collect();
                    (&self.scripts.inspect, args, 6)
                })
                .collect();
            let replies = self.eval_each(&calls).await?;
            for (key, reply) in chunk.iter().zip(replies) {
                if let Reply::Error(e) = reply {
                    return Err(server_err(e));
                }
                if let Some(info) = parse_info(&reply)? {
                    listed.push(ListedLock {
                        key: key[head.len()..].to_owned(),
                        info,
                    });
                }
            }
        }
        Ok(listed)
    }
}
