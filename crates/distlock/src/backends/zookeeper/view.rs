//! A key as its nodes show it, whatever its kind: who holds it, how many wait, the fence.
//! `inspect`, `force_release` and `list` read it (see `contenders::View`).

use super::*;
use crate::backends::contenders::{self, Queued, View};
use futures_util::future::join_all;
use queue::{sort_contenders, sort_for, sort_leases, Role};
use semaphore::{lease_owner, permits_of};
use waiters::node_owner;

/// The holders of one key, each entry a node's path.
pub(super) type Holders = contenders::Holders<String>;

/// A holder's node `path` of `kind`, created at `czxid`, held by `owner`.
fn node(kind: LockKind, path: String, czxid: i64, owner: String) -> Queued<String> {
    Queued {
        kind,
        fence: czxid,
        owner,
        entry: path,
    }
}

/// Lease nodes read (for their czxid and number of permits) per key.
const LEASES_READ: usize = 1024;
/// Keys inspected at once by `list`.
const LIST_BATCH: usize = 16;

impl Inner {
    /// Who holds the key whose node is `parent`: its first exclusive contender, or the readers
    /// before the first one, or its semaphore's permits (the first `permits` leases; every
    /// lease when the number is unknown, as for Curator's), whichever side is older when both
    /// have nodes. `None` when nobody does.
    pub(super) async fn holders(&self, conn: &Conn, parent: &str) -> Result<Option<Holders>> {
        let lease_dir = format!("{parent}/{LEASE_DIR}");
        let gate_dir = format!("{parent}/{GATE_DIR}");
        for _ in 0..MAX_SETTLE {
            let children = self.list(conn, parent).await?;
            let sorted = sort_contenders(&children);
            let n = contenders::holders(sorted.iter().map(|c| c.role.kind())).map_or(0, |h| h.1);
            let has = |d: &str| children.iter().any(|c| c == d);
            let (leases, gates) = if has(LEASE_DIR) || has(GATE_DIR) {
                let (l, g) = tokio::join!(self.list(conn, &lease_dir), self.list(conn, &gate_dir));
                (l?, g?)
            } else {
                (Vec::new(), Vec::new())
            };
            let own_paths: Vec<String> = sorted[..n]
                .iter()
                .map(|c| format!("{parent}/{}", c.name))
                .collect();
            let lease_paths: Vec<String> = sort_leases(&leases)
                .into_iter()
                .take(LEASES_READ)
                .map(|l| format!("{lease_dir}/{l}"))
                .collect();
            let read = |paths: &[String]| join_all(paths.iter().map(|p| conn.client.get_data(p)));
            let (own_stats, lease_data) = self
                .timed("get data", async {
                    tokio::join!(read(&own_paths), read(&lease_paths))
                })
                .await?;
            let mut own_holders = Vec::new();
            let mut changed = false;
            for (path, read) in own_paths.into_iter().zip(own_stats) {
                match read {
                    Ok((data, s)) => own_holders.push((path, s.czxid, node_owner(&data))),
                    Err(zookeeper_client::Error::NoNode) => changed = true,
                    Err(e) => return Err(zk_err(e)),
                }
            }
            if changed {
                continue; // a holder left meanwhile: look again
            }
            let (mut live_leases, mut permits) = (Vec::new(), None);
            for (path, data) in lease_paths.into_iter().zip(lease_data) {
                match data {
                    Ok((data, s)) => {
                        permits = permits.or(permits_of(&data));
                        live_leases.push((path, s.czxid, lease_owner(&data)));
                    }
                    Err(zookeeper_client::Error::NoNode) => {}
                    Err(e) => return Err(zk_err(e)),
                }
            }
            let semaphore = LockKind::Semaphore {
                permits: permits.unwrap_or(0),
            };
            let lease_holders =
                contenders::holders(live_leases.iter().map(|_| semaphore)).map_or(0, |h| h.1);
            let oldest_own = own_holders.iter().map(|(_, z, _)| *z).min();
            let oldest_lease = live_leases.first().map(|(_, z, _)| *z);
            let leases_hold = oldest_lease.is_some_and(|l| oldest_own.is_none_or(|o| l < o));
            let (kind, holders, waiting_leases) = if leases_hold {
                let waiting = live_leases.len() - lease_holders;
                live_leases.truncate(lease_holders);
                (semaphore, live_leases, waiting)
            } else if let Some(first) = sorted.first() {
                (first.role.kind(), own_holders, live_leases.len())
            } else {
                return Ok(None);
            };
            // A permit taker that waits holds the `locks` mutex and has a lease: count it once.
            let waiting_contenders = sorted.len() - if leases_hold { 0 } else { holders.len() };
            let waiters =
                waiting_contenders + waiting_leases + gates.len() - gates.len().min(waiting_leases);
            let held = holders.into_iter().map(|(p, z, o)| node(kind, p, z, o));
            return Ok(Some(Holders {
                kind,
                held: held.collect(),
                waiters,
            }));
        }
        Err(Error::unavailable(
            KIND,
            "the lock's nodes kept changing while inspecting it",
        ))
    }

    /// Who leads the election whose node is `parent` (Curator's `LeaderLatch`): its first
    /// `latch-` node, its data the leader's description (`LeaderLatch`'s id). `None` when
    /// nobody stands.
    pub(super) async fn leader(&self, conn: &Conn, parent: &str) -> Result<Option<Holders>> {
        for _ in 0..MAX_SETTLE {
            let children = self.list(conn, parent).await?;
            let sorted = sort_for(Role::Latch, &children);
            let Some(first) = sorted.first() else {
                return Ok(None);
            };
            let path = format!("{parent}/{}", first.name);
            match self.timed("get data", conn.client.get_data(&path)).await? {
                Ok((data, stat)) => {
                    let owner = crate::backend::Owner::shown(&data);
                    return Ok(Some(Holders {
                        kind: LockKind::Mutex,
                        held: vec![node(LockKind::Mutex, path, stat.czxid, owner)],
                        waiters: sorted.len() - 1,
                    }));
                }
                Err(zookeeper_client::Error::NoNode) => continue, // it resigned meanwhile
                Err(e) => return Err(zk_err(e)),
            }
        }
        Err(Error::unavailable(
            KIND,
            "the election's nodes kept changing while inspecting it",
        ))
    }

    /// The held keys under `root`, each as `inspect` describes it; a key whose mutex, readers,
    /// writers and permits have no holder but whose election has a leader, as the election's
    /// `inspect` describes it.
    pub(super) async fn list_held(&self, conn: &Conn, root: &str) -> Result<Vec<ListedLock>> {
        let children = self.list(conn, root).await?;
        let keys: Vec<(String, String)> = children
            .into_iter()
            .filter_map(|c| decode_key(&c).map(|k| (k, format!("{root}/{c}"))))
            .collect();
        let mut out = Vec::new();
        for batch in keys.chunks(LIST_BATCH) {
            let found = join_all(batch.iter().map(|(_, path)| async move {
                match self.holders(conn, path).await? {
                    Some(h) => Ok(Some(h)),
                    None => self.leader(conn, path).await,
                }
            }))
            .await;
            for ((key, _), holders) in batch.iter().zip(found) {
                if let Some(h) = holders? {
                    out.push(ListedLock {
                        key: key.clone(),
                        info: h.info(None),
                    });
                }
            }
        }
        Ok(out)
    }
}

impl View for ZooKeeperBackend {
    type Entry = String;

    async fn holders(&self, name: &LockName) -> Result<Option<Holders>> {
        let conn = self.inner.conn().await?;
        let parent = self.lock_path(name);
        match name.is_election() {
            true => self.inner.leader(&conn, &parent).await,
            false => self.inner.holders(&conn, &parent).await,
        }
    }

    async fn delete(&self, q: &Queued<String>) -> Result<bool> {
        let conn = self.inner.conn().await?;
        let deleted = self
            .inner
            .timed("delete", conn.client.delete(&q.entry, None));
        match deleted.await? {
            Ok(()) => Ok(true),
            Err(zookeeper_client::Error::NoNode) => Ok(false),
            Err(e) => Err(zk_err(e)),
        }
    }
}
