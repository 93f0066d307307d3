//! Watches: what a waiter watches until it looks again (a node, a folder's children), and the
//! watch task that fires the waiter's wake-up.

use super::waiters::{follow, Mark};
use super::*;

/// What a waiter watches until it looks again.
#[derive(Debug, Clone)]
pub(super) enum Watch {
    /// One node's deletion (or change): a predecessor, a holder of another kind.
    Node(String),
    /// One node's deletion (or change), whose data is never taken for a waiter's mark: an
    /// election candidate's predecessor, whose data is a description of anyone's choosing.
    Plain(String),
    /// The children of a folder (a semaphore's leases), as last seen.
    Children { dir: String, seen: Vec<String> },
}

impl Watch {
    /// What tells two watches apart (a waiter does not watch the same thing twice).
    fn key(&self) -> String {
        match self {
            Watch::Node(path) | Watch::Plain(path) => path.clone(),
            Watch::Children { dir, .. } => format!("{dir}/"),
        }
    }
}

impl Inner {
    /// Watches what `token` waits for; the watch fires `token`'s wake-up. `false` when it
    /// changed already (the node is gone, the folder's children differ from those seen): look
    /// again.
    pub(super) async fn watch(
        self: &Arc<Self>,
        conn: &Conn,
        token: Token,
        what: Watch,
    ) -> Result<bool> {
        let key = what.key();
        {
            let nodes = self.nodes.lock();
            if nodes.get(&token).and_then(|n| n.watching.as_deref()) == Some(key.as_str()) {
                return Ok(true);
            }
        }
        let mut mark = None;
        let watcher = match &what {
            Watch::Node(path) | Watch::Plain(path) => match self
                .timed("watch", conn.client.get_and_watch_data(path))
                .await?
            {
                Ok((_, _, w)) if matches!(what, Watch::Plain(_)) => w,
                Ok((data, stat, w)) => {
                    match self.predecessor_mark(conn, path, &data, &stat).await? {
                        Mark::None => {}
                        Mark::Alive(m) => mark = Some(m),
                        Mark::Dead => return Ok(false),
                    }
                    w
                }
                Err(zookeeper_client::Error::NoNode) => return Ok(false),
                Err(e) => return Err(zk_err(e)),
            },
            Watch::Children { dir, seen } => match self
                .timed("watch", conn.client.list_and_watch_children(dir))
                .await?
            {
                Ok((mut now, w)) => {
                    let mut seen = seen.clone();
                    now.sort_unstable();
                    seen.sort_unstable();
                    if now != seen {
                        return Ok(false);
                    }
                    w
                }
                Err(zookeeper_client::Error::NoNode) => return Ok(false),
                Err(e) => return Err(zk_err(e)),
            },
        };
        let signals = Arc::downgrade(&self.signals);
        let weak = Arc::downgrade(self);
        let watched = key.clone();
        let node = match &what {
            Watch::Node(path) => Some((conn.client.clone(), path.clone(), true)),
            Watch::Plain(path) => Some((conn.client.clone(), path.clone(), false)),
            Watch::Children { .. } => None,
        };
        let task = tokio::spawn(async move {
            match node {
                Some((client, path, marks)) => follow(client, path, watcher, mark, marks).await,
                None => {
                    let event = watcher.changed().await;
                    tracing::trace!(?event, "watch fired");
                }
            }
            if let Some(inner) = weak.upgrade() {
                if let Some(n) = inner.nodes.lock().get_mut(&token) {
                    if n.watching.as_deref() == Some(watched.as_str()) {
                        n.watching = None;
                        n.watch_task = None;
                    }
                }
            }
            if let Some(signals) = signals.upgrade() {
                signals.fire(&token.to_string());
            }
        });
        let mut nodes = self.nodes.lock();
        match nodes.get_mut(&token) {
            Some(n) => {
                if let Some(old) = n.watch_task.replace(task.abort_handle()) {
                    old.abort();
                }
                n.watching = Some(key);
            }
            None => task.abort(),
        }
        Ok(true)
    }
}
