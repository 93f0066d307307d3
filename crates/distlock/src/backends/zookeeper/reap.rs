//! Deleting contender nodes: on release, in the background until they are gone, and when a
//! held lease ran out unrenewed (the reaper).

use super::*;

impl Inner {
    /// Deletes a node of session `session` (of timeout `slot`), retrying until it is gone (or
    /// its session is).
    pub(super) fn delete_in_background(
        self: &Arc<Self>,
        slot: Duration,
        session: i64,
        path: String,
    ) {
        let weak = Arc::downgrade(self);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the node goes with the session
        };
        rt.spawn(async move {
            let mut pause = Duration::from_millis(20);
            loop {
                let Some(inner) = weak.upgrade() else {
                    return; // the backend and its session are gone, and the node with them
                };
                if let Ok(conn) = inner.conn_for(slot).await {
                    if conn.session != session {
                        return; // the node ended with its session
                    }
                    match inner.timed("delete", conn.client.delete(&path, None)).await {
                        Ok(Ok(())) | Ok(Err(zookeeper_client::Error::NoNode)) => return,
                        Ok(Err(e)) if session_gone(&e) => return,
                        Ok(Err(e)) => {
                            tracing::debug!(%path, error = %e, "deleting a lock node failed; retrying")
                        }
                        Err(e) => tracing::debug!(%path, error = %e, "deleting a lock node timed out; retrying"),
                    }
                }
                drop(inner);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        });
    }

    /// Forgets `token`'s node (stopping its tasks) and returns it.
    pub(super) fn forget(&self, token: Token) -> Option<Node> {
        let mut n = self.lock_nodes().remove(&token)?;
        n.stop_tasks();
        Some(n)
    }

    /// Deletes the node of a hold whose lease ran out unrenewed.
    pub(super) fn spawn_reaper(self: &Arc<Self>, token: Token) -> AbortHandle {
        let weak: Weak<Inner> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let deadline = {
                    let Some(inner) = weak.upgrade() else { return };
                    let nodes = inner.lock_nodes();
                    match nodes.get(&token) {
                        Some(n) if n.held => n.deadline,
                        _ => return,
                    }
                };
                tokio::time::sleep_until(deadline).await;
                let Some(inner) = weak.upgrade() else { return };
                let mut nodes = inner.lock_nodes();
                let expired = match nodes.get(&token) {
                    Some(n) if n.held && n.deadline <= Instant::now() => true,
                    Some(n) if n.held => false,
                    _ => return,
                };
                if expired {
                    // Our own task: take the entry without aborting ourselves.
                    let Some(mut n) = nodes.remove(&token) else {
                        return;
                    };
                    drop(nodes);
                    n.reaper = None;
                    n.stop_tasks();
                    for path in n.created_paths() {
                        tracing::debug!(%path, "lease ended without renewal; giving the lock up");
                        inner.delete_in_background(n.slot, n.session, path);
                    }
                    return;
                }
            }
        })
        .abort_handle()
    }

    /// Starts the reaper of a node just marked held (it exits at once otherwise).
    pub(super) fn install_reaper(self: &Arc<Self>, token: Token) {
        let handle = self.spawn_reaper(token);
        match self.lock_nodes().get_mut(&token) {
            Some(n) => {
                if let Some(old) = n.reaper.replace(handle) {
                    old.abort();
                }
            }
            None => handle.abort(),
        }
    }

    /// Deletes `token`'s nodes; `Ok(Some(held))` when there were any of ours to delete.
    pub(super) async fn remove(self: &Arc<Self>, token: Token) -> Result<Option<bool>> {
        let node = {
            let mut nodes = self.lock_nodes();
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
                for p in paths {
                    self.delete_in_background(node.slot, node.session, p);
                }
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
                for p in paths {
                    self.delete_in_background(node.slot, node.session, p);
                }
                return Err(e);
            }
        };
        let mut out = Ok(None);
        for (path, res) in paths.into_iter().zip(results) {
            let is_main = main.as_ref() == Some(&path);
            match res {
                Ok(()) if is_main => out = Ok(Some(node.held)),
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
