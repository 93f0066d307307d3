//! Semaphore permits in Curator's `InterProcessSemaphoreV2` layout, taken one step per attempt
//! exactly as Curator takes them, so that Curator's permits and ours share the count without
//! deadlock, and ordered against the key's other kinds by `czxid` (both as the module
//! documentation describes: the layout table, and lock kinds on one key).

use super::*;
use crate::backend::{Owner, UNKNOWN_OWNER};
use crate::backends::contenders;
use crate::backends::contenders::attempt::Look;
use attempt::{fence_of, ZkRound};
use contender::{Target, Which};
use queue::{place, sort_contenders, sort_leases, Place};
use watch::Watch;

/// The data of a distlock lease node: the semaphore's number of permits, then on a line of
/// its own the holder's owner description. (Older distlock versions wrote the first line
/// alone and read it whole, so they take these nodes for Curator's, of an unknown number.)
pub(super) fn lease_data(permits: u32, owner: &str) -> Vec<u8> {
    format!("{PERMITS}{permits}\n{owner}").into_bytes()
}

const PERMITS: &str = "permits=";

/// The number of permits a lease node's data announces (`None` for Curator's, whose data is
/// its client's address or the application's).
pub(super) fn permits_of(data: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(data).ok()?.strip_prefix(PERMITS)?;
    text.split_once('\n').map_or(text, |(n, _)| n).parse().ok()
}

/// Who holds the lease node with `data`: the description after a distlock node's number of
/// permits (unknown when an older version wrote none), else the data itself (Curator's
/// client address, or what its application set).
pub(super) fn lease_owner(data: &[u8]) -> String {
    if permits_of(data).is_none() {
        return Owner::shown(data);
    }
    match data.iter().position(|b| *b == b'\n') {
        Some(at) => Owner::shown(&data[at + 1..]),
        None => UNKNOWN_OWNER.to_owned(),
    }
}

/// Other holders whose numbers of permits are checked against a new taker's.
const PERMIT_CHECKS: usize = 64;

impl Inner {
    /// The first of `paths` (in creation order) that exists and was created before `czxid`,
    /// read four at a time: a node created after it ends the search, as every later one is
    /// younger still.
    async fn created_before(
        &self,
        conn: &Conn,
        paths: &[String],
        czxid: i64,
    ) -> Result<Option<String>> {
        for chunk in paths.chunks(4) {
            let stats = self
                .timed(
                    "exists",
                    futures_util::future::join_all(chunk.iter().map(|p| conn.client.check_stat(p))),
                )
                .await?;
            let mut younger = false;
            for (path, stat) in chunk.iter().zip(stats) {
                match stat {
                    Ok(Some(s)) if s.czxid < czxid => return Ok(Some(path.clone())),
                    Ok(Some(_)) => younger = true,
                    Ok(None) => {}
                    Err(e) => return Err(zk_err(e)),
                }
            }
            if younger {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// For a mutex, reader or writer first in its key's order (node `czxid`): the leases of
    /// the key (node `parent`) created before it, which it must wait for, as a watch on the
    /// `leases` folder. Costs nothing unless the key has a `leases` folder among `children`
    /// (listed on `conn` after our create, so a lease older than our node would show its
    /// folder).
    pub(super) async fn older_leases(
        &self,
        conn: &Conn,
        parent: &str,
        children: &[String],
        czxid: i64,
    ) -> Result<Option<Watch>> {
        if !children.iter().any(|c| c == LEASE_DIR) {
            return Ok(None);
        }
        let dir = format!("{parent}/{LEASE_DIR}");
        let leases = self.list(conn, &dir).await?;
        let paths: Vec<String> = sort_leases(&leases)
            .into_iter()
            .map(|l| format!("{dir}/{l}"))
            .collect();
        Ok(self
            .created_before(conn, &paths, czxid)
            .await?
            .map(|_| Watch::Children { dir, seen: leases }))
    }

    /// For a lease (`czxid`): the mutex, reader or writer node among the key's `children`
    /// created before it, which it must wait for.
    async fn older_exclusive(
        &self,
        conn: &Conn,
        parent: &str,
        children: &[String],
        czxid: i64,
    ) -> Result<Option<Watch>> {
        let paths: Vec<String> = sort_contenders(children)
            .iter()
            .map(|c| format!("{parent}/{}", c.name))
            .collect();
        Ok(self
            .created_before(conn, &paths, czxid)
            .await?
            .map(Watch::Node))
    }

    /// The number of permits each other lease in `leases` announces, in their order: 0 for
    /// one whose number is unknown (Curator's, gone, or beyond the first [`PERMIT_CHECKS`]).
    async fn announced_permits(
        &self,
        conn: &Conn,
        dir: &str,
        leases: &[String],
        own: &str,
    ) -> Result<Vec<u32>> {
        let others = leases.iter().filter(|l| *l != own).count();
        let read: Vec<String> = leases
            .iter()
            .filter(|l| *l != own)
            .take(PERMIT_CHECKS)
            .map(|l| format!("{dir}/{l}"))
            .collect();
        if read.is_empty() {
            return Ok(Vec::new());
        }
        let read = self
            .timed(
                "get data",
                futures_util::future::join_all(read.iter().map(|p| conn.client.get_data(p))),
            )
            .await?;
        let mut announced = Vec::with_capacity(others);
        for r in read {
            match r {
                Ok((data, _)) => announced.push(permits_of(&data).unwrap_or(0)),
                Err(zookeeper_client::Error::NoNode) => announced.push(0),
                Err(e) => return Err(zk_err(e)),
            }
        }
        announced.resize(others, 0);
        Ok(announced)
    }

    /// Deletes `path` of `conn`'s session now, else in the background.
    pub(super) async fn delete_now(self: &Arc<Self>, conn: &Conn, path: String) {
        match self.timed("delete", conn.client.delete(&path, None)).await {
            Ok(Ok(())) | Ok(Err(zookeeper_client::Error::NoNode)) => {}
            Ok(Err(e)) if session_gone(&e) => {}
            _ => self.delete_in_background(conn.slot, conn.session, path),
        }
    }
}

impl ZkRound<'_> {
    /// The look of a semaphore permit of the key at `parent` (Curator's acquire, one step per
    /// look): take the `locks` mutex, create the lease, wait until the count allows it (and no
    /// older mutex, reader or writer of the key holds), give the mutex back.
    pub(super) async fn look_permit(&mut self, permits: u32) -> Result<Look<Watch>> {
        let (inner, parent, token) = (self.inner, self.parent, self.token);
        let (gate_dir, lease_dir) = (
            &format!("{parent}/{GATE_DIR}"),
            &format!("{parent}/{LEASE_DIR}"),
        );
        let conn = inner.lease_conn(self.lease).await?;
        self.conn = Some(conn.clone());
        enum Step {
            /// Our node in `locks` is being created.
            Gate(tokio::task::JoinHandle<Result<Created>>),
            /// Our node in `locks` exists (we wait for our turn, or hold it).
            GateKnown(String),
            /// Our lease exists.
            Lease(String, i64),
        }
        let step = {
            let mut nodes = inner.nodes.lock();
            Inner::drop_if_other_session(&mut nodes, token, &conn);
            match nodes.get_mut(&token) {
                Some(n) if n.creating() => {
                    return Err(Error::unavailable(
                        KIND,
                        "an earlier attempt of this acquisition is still in flight",
                    ))
                }
                Some(n) => match (&n.phase, &n.gate) {
                    (Phase::Created { name, czxid }, _) => Step::Lease(name.clone(), *czxid),
                    (_, Phase::Created { name, .. }) => Step::GateKnown(name.clone()),
                    _ => {
                        // Nothing of it is left: start again.
                        nodes.remove(&token);
                        return Ok(Look::Again);
                    }
                },
                None => {
                    let node = inner.new_node(&conn, parent, lease_dir.clone(), true, &[]);
                    let id = node.id;
                    nodes.insert(token, node);
                    let target = Target {
                        dir: gate_dir.clone(),
                        marker: LOCK_NAME,
                        data: Vec::new(),
                        lists: vec![gate_dir.clone()],
                    };
                    Step::Gate(inner.spawn_create(conn.clone(), token, id, Which::Gate, target))
                }
            }
        };
        let (own, czxid, leases, children) = match step {
            Step::Lease(name, czxid) => {
                // `sync` first: a server cut off from the leader cannot confirm the count.
                let (leases, children) = tokio::join!(
                    inner.synced_list(&conn, lease_dir),
                    inner.list(&conn, parent)
                );
                (name, czxid, leases?, children?)
            }
            gate_step => {
                let (gate, locks) = match gate_step {
                    Step::Gate(task) => {
                        let mut created = inner.created(task).await?;
                        (created.name, created.listings.pop().unwrap_or_default())
                    }
                    Step::GateKnown(name) => {
                        let locks = inner.synced_list(&conn, gate_dir).await?;
                        (name, locks)
                    }
                    Step::Lease(..) => unreachable!("handled above"),
                };
                match place(&sort_contenders(&locks), &gate) {
                    Place::Gone => {
                        // Our turn at the mutex went (deleted underneath): start again.
                        inner.forget(token);
                        return Ok(Look::Again);
                    }
                    Place::Behind(pred) => {
                        return Ok(Look::Waits(Watch::Node(format!("{gate_dir}/{pred}")), None))
                    }
                    Place::First => {}
                }
                // Our turn: create the lease while holding the mutex.
                let id = {
                    let mut nodes = inner.nodes.lock();
                    let n = nodes.get_mut(&token).ok_or_else(|| {
                        Error::unavailable(KIND, "the acquisition was released meanwhile")
                    })?;
                    n.phase = Phase::Creating;
                    n.id
                };
                let target = Target {
                    dir: lease_dir.clone(),
                    marker: LEASE_NAME,
                    data: self.data.clone(),
                    lists: vec![lease_dir.clone(), parent.to_owned()],
                };
                let task = inner.spawn_create(conn.clone(), token, id, Which::Contender, target);
                let created = inner.created(task).await?;
                let mut listings = created.listings.into_iter();
                let leases = listings.next().unwrap_or_default();
                let children = listings.next().unwrap_or_default();
                (created.name, created.czxid, leases, children)
            }
        };
        if !leases.contains(&own) {
            // Our lease went (its session ended, or it was deleted): give the mutex back and
            // start again, as Curator does.
            inner.remove(token).await?;
            return Ok(Look::Again);
        }
        // On every attempt, not only the one that created the lease: an attempt whose create
        // outlived it leaves the lease to the next one.
        let others = inner
            .announced_permits(&conn, lease_dir, &leases, &own)
            .await?;
        let kind = LockKind::Semaphore { permits };
        let before = others
            .into_iter()
            .map(|p| (LockKind::Semaphore { permits: p }, ()));
        let blocker = match contenders::verdict(kind, before) {
            contenders::Verdict::Disagrees(other) => return Ok(Look::Disagrees(other)),
            contenders::Verdict::Full { .. } => Some(Watch::Children {
                dir: lease_dir.clone(),
                seen: leases,
            }),
            _ => {
                inner
                    .older_exclusive(&conn, parent, &children, czxid)
                    .await?
            }
        };
        match blocker {
            Some(blocker) => Ok(Look::Waits(blocker, None)),
            None => fence_of(czxid, &own).map(Look::Holds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_data_carries_the_permits() {
        let data = lease_data(3, "web-1:77");
        assert_eq!(permits_of(&data), Some(3));
        assert_eq!(lease_owner(&data), "web-1:77");
        assert_eq!(permits_of(b"127.0.0.1"), None);
        assert_eq!(permits_of(b"permits=x"), None);
        // An older distlock's lease, and Curator's (its client's address, or nothing).
        assert_eq!(permits_of(b"permits=4"), Some(4));
        assert_eq!(lease_owner(b"permits=4"), UNKNOWN_OWNER);
        assert_eq!(lease_owner(b"10.0.0.7"), "10.0.0.7");
        assert_eq!(lease_owner(b""), UNKNOWN_OWNER);
    }
}
