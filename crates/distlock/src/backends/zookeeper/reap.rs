//! Deleting contender nodes: on release, in the background until they are gone, and when a
//! held lease ran out unrenewed (the reaper, on the family's one task per backend).

use super::*;
use crate::backends::contenders::reaper::{retry_until_gone, Reap};
use crate::backends::contenders::{Fate, Rules};

impl Inner {
    /// Deletes a node of session `session` (of timeout `slot`), retrying until it is gone (or
    /// its session is).
    pub(super) fn delete_in_background(
        self: &Arc<Self>,
        slot: Duration,
        session: i64,
        path: String,
    ) {
        retry_until_gone(self, move |inner: Arc<Inner>| {
            let path = path.clone();
            async move {
                let Ok(conn) = inner.conn_for(slot).await else {
                    return false;
                };
                if conn.session != session {
                    return true; // the node ended with its session
                }
                match inner.timed("delete", conn.client.delete(&path, None)).await {
                    Ok(Ok(())) | Ok(Err(zookeeper_client::Error::NoNode)) => true,
                    Ok(Err(e)) if session_gone(&e) => true,
                    Ok(Err(e)) => {
                        tracing::debug!(%path, error = %e, "deleting a lock node failed; retrying");
                        false
                    }
                    Err(e) => {
                        tracing::debug!(%path, error = %e, "deleting a lock node timed out; retrying");
                        false
                    }
                }
            }
        });
    }

    /// Deletes every node of `n` that exists, in the background.
    pub(super) fn delete_all_in_background(self: &Arc<Self>, n: &Node) {
        for path in n.created_paths() {
            self.delete_in_background(n.slot, n.session, path);
        }
    }

    /// Forgets `token`'s node (stopping its tasks) and returns it.
    pub(super) fn forget(&self, token: Token) -> Option<Node> {
        let mut n = self.nodes.forget(token)?;
        n.stop_tasks();
        Some(n)
    }

    /// Forgets `token`'s node and deletes its nodes in the background: for a hold whose
    /// session the client saw end. The ensemble may still know that session, and `conn_for`
    /// resumes it with its nodes; a node forgotten but left there would keep the lock held by
    /// nobody for as long as this process lives. (Where the session did end, the deletion sees
    /// a new session and stops.)
    pub(super) fn forget_and_delete(self: &Arc<Self>, token: Token) {
        if let Some(n) = self.forget(token) {
            self.delete_all_in_background(&n);
        }
    }

    /// Plans the reaper's look at a node just marked held, at its lease's end.
    pub(super) fn install_reaper(self: &Arc<Self>, token: Token) {
        let deadline = self
            .nodes
            .lock()
            .get(&token)
            .filter(|n| n.held())
            .and_then(|n| n.deadline);
        if let Some(deadline) = deadline {
            self.nodes.reap_at(token, deadline);
        }
        self.nodes.reaper().run(self);
    }

    /// Deletes `token`'s nodes; `Ok(Some(held))` when there were any of ours to delete.
    pub(super) async fn remove(self: &Arc<Self>, token: Token) -> Result<Option<bool>> {
        let node = {
            let mut nodes = self.nodes.lock();
            match nodes.get_mut(&token) {
                None => return Ok(None),
                Some(n) if n.creating() => {
                    // The create task deletes them once it settles.
                    n.abandoned = true;
                    n.owned = false;
                    return Ok(None);
                }
                Some(_) => {
                    let mut n = nodes.remove(&token).expect("present");
                    n.stop_tasks();
                    self.nodes.reaper().cancel(token);
                    n
                }
            }
        };
        let paths = node.created_paths();
        if paths.is_empty() {
            return Ok(None);
        }
        let main = node.path();
        let conn = match self.conn_for(node.slot).await {
            Ok(c) => c,
            Err(e) => {
                self.delete_all_in_background(&node);
                return Err(e);
            }
        };
        if conn.session != node.session {
            return Ok(None); // gone with its session
        }
        let deletes: Vec<_> = paths.iter().map(|p| conn.client.delete(p, None)).collect();
        let results = match self
            .timed("delete", futures_util::future::join_all(deletes))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                self.delete_all_in_background(&node);
                return Err(e);
            }
        };
        let mut out = Ok(None);
        for (path, res) in paths.into_iter().zip(results) {
            let is_main = main.as_ref() == Some(&path);
            match res {
                Ok(()) if is_main => out = Ok(Some(node.held())),
                Ok(()) => {
                    if matches!(out, Ok(None)) {
                        out = Ok(Some(false));
                    }
                }
                Err(zookeeper_client::Error::NoNode) => {}
                Err(e) if session_gone(&e) => {}
                Err(e) => {
                    self.delete_in_background(node.slot, node.session, path);
                    if is_main {
                        out = Err(zk_err(e));
                    }
                }
            }
        }
        out
    }
}

impl Reap for Inner {
    type Key = Token;

    /// Deletes the nodes of a hold whose lease ran out unrenewed; a renewed one is looked at
    /// again at its new deadline.
    async fn due(self: &Arc<Self>, token: Token) -> Option<Instant> {
        let mut nodes = self.nodes.lock();
        // No rule but the hold's end: a waiter's node ends with its session or its mark.
        let fate = nodes
            .get(&token)?
            .fate(&Rules::default(), false, Instant::now());
        if let Fate::Keep(next) = fate {
            return next;
        }
        let mut n = nodes.remove(&token).expect("present");
        drop(nodes);
        n.stop_tasks();
        tracing::debug!(paths = ?n.created_paths(), "lease ended without renewal; giving the lock up");
        self.delete_all_in_background(&n);
        None
    }
}
