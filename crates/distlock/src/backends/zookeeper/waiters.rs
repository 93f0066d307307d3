//! Dead waiters. A ZooKeeper node belongs to its session for life, and a waiter's session is
//! its lease: a waiter that dies would block the lock for its lease once it reaches the head.
//! So a distlock waiter also keeps a liveness mark, an ephemeral node of a short session of its
//! backend (the waiter session, [`ZooKeeperOptions::waiter_ttl`]) at
//! `<root>/%waiters/<session id hex>`, and writes the mark's path into its own node's data
//! (`distlock-waiting:<path>`, version 1). A distlock contender that waits for such a node
//! watches the mark as well, and once the mark is gone deletes the node, conditionally on the
//! version it read. A waiter that reaches the head replaces the mark with its owner's
//! description (the data it was created with), conditionally on version 1, before it reports
//! the lock acquired. Exactly one of the two conditional writes wins: a node
//! whose holder went on to hold is never deleted for a dead mark, and a waiter whose node was
//! deleted queues again. Curator's nodes carry no mark and are left to their sessions.

use super::*;
use crate::backend::{Owner, UNKNOWN_OWNER};

/// Data of a waiting distlock node: this, then the path of its mark.
const WAITING: &[u8] = b"distlock-waiting:";
/// The folder of the marks under a root: no key maps to this name (in an encoded key `%` is
/// always followed by two hex digits), so listing skips it.
const MARKS: &str = "%waiters";
/// The data version of a node its waiter has marked (created at 0, marked once).
const MARKED: i32 = 1;

/// The data of a distlock contender node that holds (or has not been marked): its owner's
/// description, as Curator keeps its client's address there. A description that begins like a
/// mark gets a leading space (which [`Owner::shown`] trims), so that nobody takes the holder
/// for a dead waiter and deletes its node.
pub(super) fn holder_data(owner: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(owner.len() + 1);
    if owner.as_bytes().starts_with(WAITING) {
        data.push(b' ');
    }
    data.extend_from_slice(owner.as_bytes());
    data
}

/// Who holds a contender node whose data is `data`: the description distlock wrote, the
/// address Curator wrote, or unknown (an older distlock's empty data, a mark not yet cleared).
pub(super) fn node_owner(data: &[u8]) -> String {
    if mark_of(data).is_some() {
        return UNKNOWN_OWNER.to_owned();
    }
    Owner::shown(data)
}

/// The mark named by a node's `data`, when it is a waiting distlock node's.
pub(super) fn mark_of(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data.strip_prefix(WAITING)?).ok()
}

/// What [`Inner::predecessor_mark`] found of a node's mark.
pub(super) enum Mark {
    /// Not a marked distlock waiter (a holder, a foreign node).
    None,
    /// Its waiter lives; the watch fires when the mark goes.
    Alive(zookeeper_client::OneshotWatcher),
    /// Its waiter is gone and the node was deleted (or changed meanwhile): look again.
    Dead,
}

impl Inner {
    /// The session timeout asked for the waiter session.
    pub(super) fn waiter_slot(&self) -> Duration {
        session_of_lease(self.options.waiter_ttl)
    }

    /// The mark of the waiter session under `root` (created once per session and root).
    async fn ensure_mark(self: &Arc<Self>, root: &str) -> Result<String> {
        let conn = self.conn_for(self.waiter_slot()).await?;
        let path = format!("{root}/{MARKS}/{:x}", conn.session);
        let known = |m: &HashSet<String>| m.contains(&path);
        if known(&self.marks.locked()) {
            return Ok(path);
        }
        let opts = CreateMode::Ephemeral.with_acls(self.acls());
        for _ in 0..MAX_SETTLE {
            match self
                .timed("create mark", conn.client.create(&path, &[], &opts))
                .await?
            {
                Ok(_) | Err(zookeeper_client::Error::NodeExists) => {
                    let mut marks = self.marks.locked();
                    if marks.len() >= MAX_KNOWN_PARENTS {
                        marks.clear();
                    }
                    marks.insert(path.clone());
                    return Ok(path);
                }
                Err(zookeeper_client::Error::NoNode) => {
                    let dir = format!("{root}/{MARKS}");
                    let container = CreateMode::Container.with_acls(self.acls());
                    match conn.client.mkdir(&dir, &container).await {
                        Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                        Err(e) => return Err(zk_err(e)),
                    }
                }
                Err(e) => return Err(zk_err(e)),
            }
        }
        Err(Error::unavailable(
            KIND,
            "the waiters' folder kept vanishing",
        ))
    }

    /// Forgets which marks exist, after a marked node was deleted as a dead waiter's although
    /// its waiter lives: its mark may be gone with the session still alive (deleted by hand),
    /// and the next waiter creates it again instead of marking nodes with a missing mark.
    pub(super) fn forget_marks(&self) {
        self.marks.locked().clear();
    }

    /// Marks `token`'s node at `path` (a waiter's, under the key's node `parent`) with the
    /// waiter session's mark, once. A failure leaves it unmarked: its lease bounds it then.
    pub(super) async fn mark_node(
        self: &Arc<Self>,
        conn: &Conn,
        token: Token,
        parent: &str,
        path: &str,
    ) {
        let unmarked = self
            .nodes
            .lock()
            .get(&token)
            .is_some_and(|n| n.marked.is_none());
        if !unmarked {
            return;
        }
        let root = parent.rsplit_once('/').map_or("", |(r, _)| r);
        let res = async {
            let mark = self.ensure_mark(root).await?;
            let mut data = WAITING.to_vec();
            data.extend_from_slice(mark.as_bytes());
            self.timed("mark", conn.client.set_data(path, &data, Some(MARKED - 1)))
                .await
        }
        .await;
        match res {
            Ok(Ok(_)) => {
                if let Some(n) = self.nodes.lock().get_mut(&token) {
                    n.marked = Some(MARKED);
                }
            }
            Ok(Err(e)) => tracing::debug!(%path, error = %e, "marking a waiting node failed"),
            Err(e) => tracing::debug!(%path, error = %e, "marking a waiting node failed"),
        }
    }

    /// Before `token`'s marked node at `path` holds: replaces its mark with its owner's
    /// description (conditional on the marked version), so that nobody takes it for a dead
    /// waiter's any more. `false` when the
    /// node is gone: a waiter behind it deleted it after its mark went (or its session ended).
    pub(super) async fn claim(&self, conn: &Conn, token: Token, path: &str) -> Result<bool> {
        let marked = self
            .nodes
            .lock()
            .get(&token)
            .and_then(|n| Some((n.marked?, n.data.clone())));
        let Some((version, data)) = marked else {
            return Ok(true);
        };
        match self
            .timed("claim", conn.client.set_data(path, &data, Some(version)))
            .await?
        {
            // A version changed by someone else also keeps the deleters off (they delete
            // conditionally on the marked version).
            Ok(_) | Err(zookeeper_client::Error::BadVersion) => {
                if let Some(n) = self.nodes.lock().get_mut(&token) {
                    n.marked = None;
                }
                Ok(true)
            }
            Err(zookeeper_client::Error::NoNode) => Ok(false),
            Err(e) if session_gone(&e) => Ok(false),
            Err(e) => Err(zk_err(e)),
        }
    }

    /// The mark of the node at `path` whose `data` and `stat` were just read: watched when it
    /// lives, and when it is gone the node is deleted (conditionally on `stat`'s version).
    pub(super) async fn predecessor_mark(
        &self,
        conn: &Conn,
        path: &str,
        data: &[u8],
        stat: &zookeeper_client::Stat,
    ) -> Result<Mark> {
        let Some(mark) = mark_of(data) else {
            return Ok(Mark::None);
        };
        match self
            .timed("watch mark", conn.client.check_and_watch_stat(mark))
            .await?
        {
            Ok((Some(_), w)) => return Ok(Mark::Alive(w)),
            Ok((None, _)) => {}
            Err(e) => return Err(zk_err(e)),
        }
        match self
            .timed("delete", conn.client.delete(path, Some(stat.version)))
            .await?
        {
            Ok(()) => tracing::debug!(%path, "deleted the node of a dead waiter"),
            Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion) => {}
            Err(e) => return Err(zk_err(e)),
        }
        Ok(Mark::Dead)
    }
}

/// Waits until the watched predecessor `path` asks its waiter to look again: the node deleted,
/// its mark gone, the session's end. A change of the node's data alone (its waiter marking it,
/// or clearing the mark as it goes on to hold) re-arms the watches instead, so that the
/// successor of a new holder is not woken for nothing. Without `marks` (an election
/// candidate's predecessor, which is never marked) any change asks to look again.
pub(super) async fn follow(
    client: Client,
    path: String,
    mut watcher: zookeeper_client::OneshotWatcher,
    mut mark: Option<zookeeper_client::OneshotWatcher>,
    marks: bool,
) {
    loop {
        let event = match mark.take() {
            Some(m) => tokio::select! {
                e = watcher.changed() => e,
                e = m.changed() => {
                    tracing::trace!(?e, "mark watch fired");
                    return;
                }
            },
            None => watcher.changed().await,
        };
        tracing::trace!(?event, "watch fired");
        if !marks || event.event_type != zookeeper_client::EventType::NodeDataChanged {
            return;
        }
        let Ok((data, _, w)) = client.get_and_watch_data(&path).await else {
            return;
        };
        watcher = w;
        if let Some(m) = mark_of(&data) {
            match client.check_and_watch_stat(m).await {
                Ok((Some(_), w)) => mark = Some(w),
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_read_from_waiting_nodes_only() {
        assert_eq!(
            mark_of(b"distlock-waiting:/lock/%waiters/1f"),
            Some("/lock/%waiters/1f")
        );
        assert_eq!(mark_of(b""), None);
        // Curator's default node data: the client's address.
        assert_eq!(mark_of(b"127.0.0.1"), None);
        assert_eq!(decode_key(MARKS), None, "no key maps to the marks' folder");
    }

    #[test]
    fn holders_data_is_their_owner_and_never_a_mark() {
        assert_eq!(node_owner(&holder_data("web-1:77")), "web-1:77");
        let sly = holder_data("distlock-waiting:/lock/%waiters/1f");
        assert_eq!(mark_of(&sly), None);
        assert_eq!(node_owner(&sly), "distlock-waiting:/lock/%waiters/1f");
        assert_eq!(
            node_owner(b"distlock-waiting:/lock/%waiters/1f"),
            UNKNOWN_OWNER
        );
        assert_eq!(node_owner(b""), UNKNOWN_OWNER);
        assert_eq!(node_owner(b"172.17.0.2"), "172.17.0.2");
    }
}
