//! Contender nodes: creating them (Curator's protected mode), finding our place in the queue,
//! watching the predecessor, and deleting them (on release, on an abandoned attempt, or when a
//! lease ran out unrenewed).

use super::*;

/// The token as a UUID (8-4-4-4-12 hex digits), the `<uuid>` of Curator's protected names.
pub(super) fn uuid_of(token: Token) -> String {
    let v = token.as_u128();
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (v >> 96) as u32,
        (v >> 80) as u16,
        (v >> 64) as u16,
        (v >> 48) as u16,
        v & 0xffff_ffff_ffff
    )
}

/// `_c_<uuid>-`: the start of every node name of `token`.
pub(super) fn protected_prefix(token: Token) -> String {
    format!("{PROTECTED}{}-", uuid_of(token))
}

/// The sequence number of a contender node (`…lock-<digits>`), as Curator sorts them.
pub(super) fn sequence_of(child: &str) -> Option<i64> {
    let i = child.rfind(LOCK_NAME)?;
    let digits = &child[i + LOCK_NAME.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The lock's contenders in queue order (lowest sequence first); other children are ignored.
pub(super) fn sort_contenders(children: &[String]) -> Vec<&str> {
    let mut v: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|c| sequence_of(c).map(|s| (s, c.as_str())))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, c)| c).collect()
}

impl Inner {
    pub(super) async fn list(&self, conn: &Conn, parent: &str) -> Result<Vec<String>> {
        match self
            .timed("get children", conn.client.list_children(parent))
            .await?
        {
            Ok(c) => Ok(c),
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(zk_err(e)),
        }
    }

    /// Lists children after a `sync`, so that the answer is as new as the leader's.
    pub(super) async fn synced_list(&self, conn: &Conn, parent: &str) -> Result<Vec<String>> {
        let sync = conn.client.sync(parent);
        let list = conn.client.list_children(parent);
        let (synced, listed) = self
            .timed("sync and get children", async { tokio::join!(sync, list) })
            .await?;
        match synced.and(listed) {
            Ok(c) => Ok(c),
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(zk_err(e)),
        }
    }

    pub(super) fn parent_known(&self, parent: &str) -> bool {
        self.parents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(parent)
    }

    pub(super) fn set_parent_known(&self, parent: &str, known: bool) {
        let mut p = self.parents.lock().unwrap_or_else(|e| e.into_inner());
        if known {
            if p.len() >= MAX_KNOWN_PARENTS {
                p.clear();
            }
            p.insert(parent.to_owned());
        } else {
            p.remove(parent);
        }
    }

    /// Creates `token`'s contender node under `parent` (and the parent when missing), and lists
    /// the parent right after it in the same round trip. After a connection loss during the
    /// create, looks for the node by its protected prefix before creating again.
    pub(super) async fn create_node(
        &self,
        conn: &Conn,
        token: Token,
        parent: &str,
    ) -> Result<Created> {
        let own = protected_prefix(token);
        let prefix = format!("{parent}/{own}{LOCK_NAME}");
        let acls = self.acls();
        let node_opts = CreateMode::EphemeralSequential.with_acls(acls);
        let parent_opts = CreateMode::Container.with_acls(acls);
        let client = &conn.client;
        let mut tries = 0;
        loop {
            tries += 1;
            // Requests go out in call order and the server applies a session's requests in
            // order, so the listing sees the create.
            let mk = (!self.parent_known(parent)).then(|| client.create(parent, &[], &parent_opts));
            let create = client.create(&prefix, &[], &node_opts);
            let list = client.list_children(parent);
            if let Some(mk) = mk {
                let _ = mk.await; // NodeExists is fine; any real problem shows in the create
            }
            let (created, listed) = tokio::join!(create, list);
            match created {
                Ok((stat, seq)) => {
                    self.set_parent_known(parent, true);
                    let children = match listed {
                        Ok(c) => c,
                        Err(_) => self.list_retrying(conn, parent).await?,
                    };
                    return Ok(Created {
                        name: format!("{own}{LOCK_NAME}{seq}"),
                        czxid: stat.czxid,
                        children,
                    });
                }
                Err(zookeeper_client::Error::NoNode) if tries < MAX_SETTLE => {
                    // The parent is missing (first use, or the server reaped it when empty).
                    self.set_parent_known(parent, false);
                    match client.mkdir(parent, &parent_opts).await {
                        Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                        Err(e) => return Err(zk_err(e)),
                    }
                }
                Err(zookeeper_client::Error::ConnectionLoss) if tries < MAX_SETTLE * 4 => {
                    // The create may or may not have been applied (Curator's protected mode).
                    let children = self.list_retrying(conn, parent).await?;
                    if let Some(name) = children.iter().find(|c| c.starts_with(&own)) {
                        let path = format!("{parent}/{name}");
                        match client.check_stat(&path).await {
                            Ok(Some(stat)) => {
                                return Ok(Created {
                                    name: name.clone(),
                                    czxid: stat.czxid,
                                    children,
                                })
                            }
                            Ok(None) => {} // deleted meanwhile: create again
                            Err(e) => return Err(zk_err(e)),
                        }
                    }
                }
                Err(e) => return Err(zk_err(e)),
            }
        }
    }

    /// Lists children, waiting out connection losses (the client reconnects by itself; a
    /// session that ends fails it).
    pub(super) async fn list_retrying(&self, conn: &Conn, parent: &str) -> Result<Vec<String>> {
        let mut pause = Duration::from_millis(10);
        loop {
            match conn.client.list_children(parent).await {
                Ok(c) => return Ok(c),
                Err(zookeeper_client::Error::NoNode) => return Ok(Vec::new()),
                Err(zookeeper_client::Error::ConnectionLoss) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(zk_err(e)),
            }
        }
    }

    /// Starts creating `token`'s node in a task of its own: the create settles (and its node is
    /// deleted again if nobody takes it) even when the caller gives up or is cancelled.
    pub(super) fn spawn_create(
        self: &Arc<Self>,
        conn: Arc<Conn>,
        token: Token,
        id: u64,
        parent: String,
    ) -> tokio::task::JoinHandle<Result<Created>> {
        let inner = self.clone();
        tokio::spawn(async move {
            let res = inner.create_node(&conn, token, &parent).await;
            let mut nodes = inner.lock_nodes();
            let taken = match nodes.get_mut(&token) {
                Some(n) if n.id != id => false,
                Some(n) if matches!(n.phase, Phase::Creating { abandoned: false }) => {
                    match &res {
                        Ok(c) => {
                            n.phase = Phase::Created {
                                name: c.name.clone(),
                                czxid: c.czxid,
                            };
                        }
                        Err(_) => {
                            nodes.remove(&token);
                        }
                    }
                    true
                }
                Some(n) if matches!(n.phase, Phase::Creating { abandoned: true }) => {
                    nodes.remove(&token);
                    false
                }
                _ => false,
            };
            drop(nodes);
            if taken {
                return res;
            }
            if let Ok(c) = &res {
                inner.delete_in_background(conn.slot, conn.session, format!("{parent}/{}", c.name));
            }
            Err(Error::unavailable(KIND, "the acquisition was abandoned"))
        })
    }

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
                    if let Some(path) = n.path() {
                        tracing::debug!(%path, "lease ended without renewal; giving the lock up");
                        inner.delete_in_background(n.slot, n.session, path);
                    }
                    return;
                }
            }
        })
        .abort_handle()
    }

    /// Watches `pred` (our predecessor) for deletion; the watch fires `token`'s wake-up.
    /// `false` when `pred` is already gone.
    pub(super) async fn watch_predecessor(
        self: &Arc<Self>,
        conn: &Conn,
        token: Token,
        parent: &str,
        pred: &str,
    ) -> Result<bool> {
        {
            let nodes = self.lock_nodes();
            if nodes.get(&token).and_then(|n| n.watching.as_deref()) == Some(pred) {
                return Ok(true);
            }
        }
        let path = format!("{parent}/{pred}");
        let watcher = match self
            .timed("watch", conn.client.get_and_watch_data(&path))
            .await?
        {
            Ok((_, _, w)) => w,
            Err(zookeeper_client::Error::NoNode) => return Ok(false),
            Err(e) => return Err(zk_err(e)),
        };
        let signals = Arc::downgrade(&self.signals);
        let weak = Arc::downgrade(self);
        let watched = pred.to_owned();
        let task = tokio::spawn(async move {
            let event = watcher.changed().await;
            tracing::trace!(?event, "predecessor watch fired");
            if let Some(inner) = weak.upgrade() {
                if let Some(n) = inner.lock_nodes().get_mut(&token) {
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
        let mut nodes = self.lock_nodes();
        match nodes.get_mut(&token) {
            Some(n) => {
                if let Some(old) = n.watch_task.replace(task.abort_handle()) {
                    old.abort();
                }
                n.watching = Some(pred.to_owned());
            }
            None => task.abort(),
        }
        Ok(true)
    }

    /// One acquisition attempt; `queued` callers stay in the queue when the lock is busy.
    pub(super) async fn attempt(self: &Arc<Self>, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let queued = request.queued();
        let parent = self.parent_path(name);
        let mut guard = Unowned {
            inner: self,
            token,
            armed: true,
        };
        // A connection that breaks (its server died, the ensemble is electing a leader) is
        // replaced by the client within the request timeout; an attempt is safe to repeat for
        // the same token (it finds its own node), so it is repeated until then.
        let deadline = tokio::time::Instant::now() + self.options.request_timeout;
        let mut pause = Duration::from_millis(20);
        let mut res = self.attempt_inner(&parent, token, lease, queued).await;
        while let Err(e) = &res {
            if !e.is_retryable() || tokio::time::Instant::now() + pause >= deadline {
                break;
            }
            tracing::debug!(error = %e, "attempt failed on a broken connection; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
            res = self.attempt_inner(&parent, token, lease, queued).await;
        }
        if res.is_ok() {
            guard.armed = false;
        }
        res
    }

    pub(super) async fn attempt_inner(
        self: &Arc<Self>,
        parent: &str,
        token: Token,
        lease: Duration,
        queued: bool,
    ) -> Result<Attempt> {
        let slot = session_of_lease(lease);
        for _ in 0..MAX_SETTLE {
            let conn = self.conn_for(slot).await?;
            check_lease(&conn, lease)?;
            enum Have {
                Creating(tokio::task::JoinHandle<Result<Created>>),
                Known(String, i64),
            }
            let have = {
                let mut nodes = self.lock_nodes();
                if nodes.get(&token).is_some_and(|n| n.session != conn.session) {
                    // Its session ended, and the node with it.
                    if let Some(mut n) = nodes.remove(&token) {
                        n.stop_tasks();
                    }
                }
                match nodes.get_mut(&token) {
                    Some(n) => match &n.phase {
                        Phase::Creating { .. } => {
                            return Err(Error::unavailable(
                                KIND,
                                "an earlier attempt of this acquisition is still in flight",
                            ))
                        }
                        Phase::Created { name, czxid } => Have::Known(name.clone(), *czxid),
                    },
                    None => {
                        let id = NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed);
                        nodes.insert(
                            token,
                            Node {
                                id,
                                parent: parent.to_owned(),
                                slot,
                                session: conn.session,
                                phase: Phase::Creating { abandoned: false },
                                owned: false,
                                held: false,
                                deadline: Instant::now(),
                                watching: None,
                                watch_task: None,
                                reaper: None,
                            },
                        );
                        Have::Creating(self.spawn_create(
                            conn.clone(),
                            token,
                            id,
                            parent.to_owned(),
                        ))
                    }
                }
            };
            let (own, czxid, children) = match have {
                Have::Creating(task) => {
                    let created = self
                        .timed("create", task)
                        .await?
                        .map_err(|e| Error::backend(KIND, format!("create task failed: {e}")))??;
                    (created.name, created.czxid, created.children)
                }
                Have::Known(name, czxid) => {
                    // `sync` first: a server cut off from the leader cannot confirm our place.
                    let children = self.synced_list(&conn, parent).await?;
                    (name, czxid, children)
                }
            };
            let sorted = sort_contenders(&children);
            match sorted.iter().position(|c| *c == own) {
                None => {
                    // Our node is gone (deleted underneath): join the queue again.
                    self.forget(token);
                    continue;
                }
                Some(0) => {
                    let fence = u64::try_from(czxid).map_err(|_| {
                        Error::backend(KIND, format!("negative czxid {czxid} of {own}"))
                    })?;
                    let mut nodes = self.lock_nodes();
                    let n = nodes.get_mut(&token).ok_or_else(|| {
                        Error::unavailable(KIND, "the node was released meanwhile")
                    })?;
                    n.owned = true;
                    n.held = true;
                    n.deadline = Instant::now() + lease;
                    if let Some(t) = n.watch_task.take() {
                        t.abort();
                    }
                    n.watching = None;
                    drop(nodes);
                    self.install_reaper(token);
                    return Ok(Attempt::Acquired { fence });
                }
                Some(_) if !queued => {
                    // try_lock: leave at once.
                    let path = format!("{parent}/{own}");
                    match self
                        .timed("delete", conn.client.delete(&path, None))
                        .await?
                    {
                        Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                        Err(e) if session_gone(&e) => {}
                        Err(e) => return Err(zk_err(e)), // the guard deletes it in the background
                    }
                    self.forget(token);
                    return Ok(Attempt::Busy { retry_after: None });
                }
                Some(i) => {
                    let pred = sorted[i - 1].to_owned();
                    if !self.watch_predecessor(&conn, token, parent, &pred).await? {
                        continue; // the predecessor left meanwhile: look again
                    }
                    match self.lock_nodes().get_mut(&token) {
                        Some(n) => n.owned = true,
                        None => continue,
                    }
                    return Ok(Attempt::Busy { retry_after: None });
                }
            }
        }
        Err(Error::unavailable(
            KIND,
            "the lock's nodes kept changing under this attempt",
        ))
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

    /// Deletes `token`'s node; `Ok(Some(held))` when it was ours to delete.
    pub(super) async fn remove(self: &Arc<Self>, token: Token) -> Result<Option<bool>> {
        let node = {
            let mut nodes = self.lock_nodes();
            match nodes.get_mut(&token) {
                None => return Ok(None),
                Some(n) if matches!(n.phase, Phase::Creating { .. }) => {
                    // The create task deletes it once it settles.
                    n.phase = Phase::Creating { abandoned: true };
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
        let path = node.path().expect("created");
        let conn = match self.conn_for(node.slot).await {
            Ok(c) => c,
            Err(e) => {
                self.delete_in_background(node.slot, node.session, path);
                return Err(e);
            }
        };
        if conn.session != node.session {
            return Ok(None); // gone with its session
        }
        match self.timed("delete", conn.client.delete(&path, None)).await {
            Ok(Ok(())) => Ok(Some(node.held)),
            Ok(Err(zookeeper_client::Error::NoNode)) => Ok(None),
            Ok(Err(e)) if session_gone(&e) => Ok(None),
            Ok(Err(e)) => {
                self.delete_in_background(node.slot, node.session, path);
                Err(zk_err(e))
            }
            Err(e) => {
                self.delete_in_background(node.slot, node.session, path);
                Err(e)
            }
        }
    }
}

/// Armed while an acquisition call runs: if it ends without handing the node to the registry
/// (an error, a timeout, cancellation), the node is deleted (now or when its create settles).
struct Unowned<'a> {
    inner: &'a Arc<Inner>,
    token: Token,
    armed: bool,
}

impl Drop for Unowned<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut nodes = self.inner.lock_nodes();
        let Some(n) = nodes.get_mut(&self.token) else {
            return;
        };
        if n.owned {
            return; // an earlier call handed it over: the registry leaves the queue
        }
        match n.phase {
            Phase::Creating { .. } => n.phase = Phase::Creating { abandoned: true },
            Phase::Created { .. } => {
                let mut n = nodes.remove(&self.token).expect("present");
                drop(nodes);
                n.stop_tasks();
                if let Some(path) = n.path() {
                    self.inner.delete_in_background(n.slot, n.session, path);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_curator_shaped_and_unique_per_token() {
        let t = Token::from(0x0123_4567_89ab_cdef_0011_2233_4455_6677u128);
        assert_eq!(uuid_of(t), "01234567-89ab-cdef-0011-223344556677");
        assert_eq!(
            protected_prefix(t),
            "_c_01234567-89ab-cdef-0011-223344556677-"
        );
    }

    #[test]
    fn contenders_sort_by_sequence_like_curator() {
        let children: Vec<String> = [
            "_c_b-lock-0000000010",
            "_c_a-lock-0000000002",
            "foreign",
            "_c_c-lock-0000000003",
            "x-lock-",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            sort_contenders(&children),
            [
                "_c_a-lock-0000000002",
                "_c_c-lock-0000000003",
                "_c_b-lock-0000000010"
            ]
        );
    }
}
