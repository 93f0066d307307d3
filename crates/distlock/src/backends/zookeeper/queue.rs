//! Contender nodes: creating them (Curator's protected mode), finding our place in the queue,
//! watching what we wait for, and deleting them (on release, on an abandoned attempt, or when a
//! lease ran out unrenewed).
//!
//! Mutexes, readers and writers of a key are children of the key's node, in Curator's names
//! (`_c_<uuid>-lock-<seq>`, `…-__READ__<seq>`, `…-__WRIT__<seq>`); they share the parent's
//! sequence counter, so one order covers them all. An exclusive contender (mutex or writer)
//! holds when it is first in that order; a reader holds when no exclusive contender is before
//! it. Either also waits for the semaphore permits of the key that are older than it (see
//! `semaphore.rs`).

use super::waiters::{follow, Mark};
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

/// What a contender node under a key's node is, by the name Curator gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// `lock-`: Curator's `InterProcessMutex`, Spring's registry, distlock's mutex.
    Mutex,
    /// `__READ__`: a reader of Curator's `InterProcessReadWriteLock`.
    Read,
    /// `__WRIT__`: its writer.
    Write,
}

impl Role {
    pub(super) fn of(kind: LockKind) -> Role {
        match kind {
            LockKind::Read => Role::Read,
            LockKind::Write => Role::Write,
            _ => Role::Mutex,
        }
    }

    pub(super) fn marker(self) -> &'static str {
        match self {
            Role::Mutex => LOCK_NAME,
            Role::Read => READ_NAME,
            Role::Write => WRITE_NAME,
        }
    }

    pub(super) fn is_exclusive(self) -> bool {
        self != Role::Read
    }

    pub(super) fn kind(self) -> LockKind {
        match self {
            Role::Mutex => LockKind::Mutex,
            Role::Read => LockKind::Read,
            Role::Write => LockKind::Write,
        }
    }

    /// Curator's readers take any name with `__WRIT__` for a writer, so that decides first.
    fn of_name(child: &str) -> Option<Role> {
        if child.contains(WRITE_NAME) {
            Some(Role::Write)
        } else if child.contains(READ_NAME) {
            Some(Role::Read)
        } else if child.contains(LOCK_NAME) {
            Some(Role::Mutex)
        } else {
            None
        }
    }
}

/// One contender node under a key's node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Contender<'a> {
    pub(super) seq: i64,
    pub(super) role: Role,
    pub(super) name: &'a str,
}

/// The sequence number after the last `marker` in `child` (Curator's `fixForSorting`).
pub(super) fn sequence_after(child: &str, marker: &str) -> Option<i64> {
    let i = child.rfind(marker)?;
    let digits = &child[i + marker.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn contender(child: &str) -> Option<Contender<'_>> {
    let role = Role::of_name(child)?;
    Some(Contender {
        seq: sequence_after(child, role.marker())?,
        role,
        name: child,
    })
}

/// A key's contenders in queue order (lowest sequence first, ties by name); other children
/// (a semaphore's folders, foreign nodes) are ignored.
pub(super) fn sort_contenders(children: &[String]) -> Vec<Contender<'_>> {
    let mut v: Vec<Contender<'_>> = children.iter().filter_map(|c| contender(c)).collect();
    v.sort_unstable_by(|a, b| (a.seq, a.name).cmp(&(b.seq, b.name)));
    v
}

/// Lease nodes in creation order (every child of a `leases` folder counts, as in Curator).
pub(super) fn sort_leases(children: &[String]) -> Vec<&str> {
    let mut v: Vec<(i64, &str)> = children
        .iter()
        .map(|c| (sequence_after(c, LEASE_NAME).unwrap_or(-1), c.as_str()))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, c)| c).collect()
}

/// Where a contender stands in its key's queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Place<'a> {
    /// Its node is not among the children (deleted underneath, or its session ended).
    Gone,
    /// Nothing before it excludes it.
    First,
    /// It waits for this contender (the nearest one before it that excludes it).
    Behind(&'a str),
}

/// The place of `own`: an exclusive contender waits for every contender before it, a reader
/// for the exclusive ones before it. A tie (a non-sequential node that copied another's
/// sequence, as Curator 5.5's downgrade does) counts as before.
pub(super) fn place<'a>(sorted: &[Contender<'a>], own: &str) -> Place<'a> {
    let Some(me) = sorted.iter().find(|c| c.name == own) else {
        return Place::Gone;
    };
    let blocker = sorted.iter().rev().find(|c| {
        c.name != own && c.seq <= me.seq && (me.role.is_exclusive() || c.role.is_exclusive())
    });
    match blocker {
        Some(c) => Place::Behind(c.name),
        None => Place::First,
    }
}

/// What a waiter watches until it looks again.
#[derive(Debug, Clone)]
pub(super) enum Watch {
    /// One node's deletion (or change): a predecessor, a holder of another kind.
    Node(String),
    /// The children of a folder (a semaphore's leases), as last seen.
    Children { dir: String, seen: Vec<String> },
}

impl Watch {
    /// What tells two watches apart (a waiter does not watch the same thing twice).
    fn key(&self) -> String {
        match self {
            Watch::Node(path) => path.clone(),
            Watch::Children { dir, .. } => format!("{dir}/"),
        }
    }
}

/// Which node of a [`Node`] a create is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    Contender,
    Gate,
}

/// A create: where the node goes, its name after the protected prefix, its data, and the
/// folders listed right after it in the same round trip.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) dir: String,
    pub(super) marker: &'static str,
    pub(super) data: Vec<u8>,
    pub(super) lists: Vec<String>,
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

    /// Creates `token`'s node as `target` says (and its folder when missing), and lists the
    /// target's folders right after it in the same round trip. After a connection loss during
    /// the create, looks for the node by its protected prefix before creating again.
    pub(super) async fn create_node(
        &self,
        conn: &Conn,
        token: Token,
        target: &Target,
    ) -> Result<Created> {
        let own = protected_prefix(token);
        let dir = target.dir.as_str();
        let prefix = format!("{dir}/{own}{}", target.marker);
        let acls = self.acls();
        let node_opts = CreateMode::EphemeralSequential.with_acls(acls);
        let parent_opts = CreateMode::Container.with_acls(acls);
        let client = &conn.client;
        let mut tries = 0;
        loop {
            tries += 1;
            // Requests go out in call order and the server applies a session's requests in
            // order, so the listings see the create.
            let mk = (!self.parent_known(dir)).then(|| client.create(dir, &[], &parent_opts));
            let create = client.create(&prefix, &target.data, &node_opts);
            let lists: Vec<_> = target
                .lists
                .iter()
                .map(|d| client.list_children(d))
                .collect();
            if let Some(mk) = mk {
                let _ = mk.await; // NodeExists is fine; any real problem shows in the create
            }
            let (created, listed) = tokio::join!(create, futures_util::future::join_all(lists));
            match created {
                Ok((stat, seq)) => {
                    self.set_parent_known(dir, true);
                    let mut listings = Vec::with_capacity(listed.len());
                    for (d, l) in target.lists.iter().zip(listed) {
                        listings.push(match l {
                            Ok(c) => c,
                            Err(zookeeper_client::Error::NoNode) => Vec::new(),
                            Err(_) => self.list_retrying(conn, d).await?,
                        });
                    }
                    return Ok(Created {
                        name: format!("{own}{}{seq}", target.marker),
                        czxid: stat.czxid,
                        listings,
                    });
                }
                Err(zookeeper_client::Error::NoNode) if tries < MAX_SETTLE => {
                    // The folder is missing (first use, or the server reaped it when empty).
                    self.set_parent_known(dir, false);
                    match client.mkdir(dir, &parent_opts).await {
                        Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                        Err(e) => return Err(zk_err(e)),
                    }
                }
                Err(zookeeper_client::Error::ConnectionLoss) if tries < MAX_SETTLE * 4 => {
                    // The create may or may not have been applied (Curator's protected mode).
                    let children = self.list_retrying(conn, dir).await?;
                    if let Some(name) = children.iter().find(|c| c.starts_with(&own)) {
                        let path = format!("{dir}/{name}");
                        match client.check_stat(&path).await {
                            Ok(Some(stat)) => {
                                let mut listings = Vec::with_capacity(target.lists.len());
                                for d in &target.lists {
                                    listings.push(if d == dir {
                                        children.clone()
                                    } else {
                                        self.list_retrying(conn, d).await?
                                    });
                                }
                                return Ok(Created {
                                    name: name.clone(),
                                    czxid: stat.czxid,
                                    listings,
                                });
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

    /// Starts creating `token`'s node (`which` of its entry `id`) in a task of its own: the
    /// create settles (and its node is deleted again if nobody takes it, with the entry's other
    /// nodes) even when the caller gives up or is cancelled.
    pub(super) fn spawn_create(
        self: &Arc<Self>,
        conn: Arc<Conn>,
        token: Token,
        id: u64,
        which: Which,
        target: Target,
    ) -> tokio::task::JoinHandle<Result<Created>> {
        let inner = self.clone();
        tokio::spawn(async move {
            let res = inner.create_node(&conn, token, &target).await;
            let mut nodes = inner.lock_nodes();
            let mut orphans = Vec::new();
            let taken = match nodes.get_mut(&token) {
                Some(n) if n.id != id => false,
                Some(n) if n.abandoned => {
                    let mut n = nodes.remove(&token).expect("present");
                    n.stop_tasks();
                    orphans = n.created_paths();
                    false
                }
                Some(n) => {
                    let phase = match which {
                        Which::Contender => &mut n.phase,
                        Which::Gate => &mut n.gate,
                    };
                    if matches!(phase, Phase::Creating) {
                        *phase = match &res {
                            Ok(c) => Phase::Created {
                                name: c.name.clone(),
                                czxid: c.czxid,
                            },
                            Err(_) => Phase::Absent,
                        };
                        if res.is_err() && n.created_paths().is_empty() && !n.creating() {
                            nodes.remove(&token);
                        }
                        true
                    } else {
                        false
                    }
                }
                None => false,
            };
            drop(nodes);
            if taken {
                return res;
            }
            if let Ok(c) = &res {
                orphans.push(format!("{}/{}", target.dir, c.name));
            }
            for path in orphans {
                inner.delete_in_background(conn.slot, conn.session, path);
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
            let nodes = self.lock_nodes();
            if nodes.get(&token).and_then(|n| n.watching.as_deref()) == Some(key.as_str()) {
                return Ok(true);
            }
        }
        let mut mark = None;
        let watcher = match &what {
            Watch::Node(path) => match self
                .timed("watch", conn.client.get_and_watch_data(path))
                .await?
            {
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
            Watch::Node(path) => Some((conn.client.clone(), path.clone())),
            Watch::Children { .. } => None,
        };
        let task = tokio::spawn(async move {
            match node {
                Some((client, path)) => follow(client, path, watcher, mark).await,
                None => {
                    let event = watcher.changed().await;
                    tracing::trace!(?event, "watch fired");
                }
            }
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
                n.watching = Some(key);
            }
            None => task.abort(),
        }
        Ok(true)
    }

    /// One acquisition attempt; `queued` callers stay in the queue when the lock is busy.
    pub(super) async fn attempt(self: &Arc<Self>, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let queued = request.queued();
        let kind = name.kind();
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
        let mut res = self.attempt_kind(&parent, kind, token, lease, queued).await;
        while let Err(e) = &res {
            if !e.is_retryable() || tokio::time::Instant::now() + pause >= deadline {
                break;
            }
            tracing::debug!(error = %e, "attempt failed on a broken connection; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
            res = self.attempt_kind(&parent, kind, token, lease, queued).await;
        }
        if res.is_ok() {
            guard.armed = false;
        }
        res
    }

    async fn attempt_kind(
        self: &Arc<Self>,
        parent: &str,
        kind: LockKind,
        token: Token,
        lease: Duration,
        queued: bool,
    ) -> Result<Attempt> {
        match kind {
            LockKind::Semaphore { permits } => {
                self.attempt_permit(parent, permits, token, lease, queued)
                    .await
            }
            other => {
                self.attempt_inner(parent, Role::of(other), token, lease, queued)
                    .await
            }
        }
    }

    /// A new entry for `token` of session `conn`, its first node being created: the gate of a
    /// semaphore permit (`gate`), else the contender in `dir`.
    pub(super) fn new_node(&self, conn: &Conn, parent: &str, dir: String, gate: bool) -> Node {
        Node {
            id: NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed),
            parent: parent.to_owned(),
            dir,
            slot: conn.slot,
            session: conn.session,
            marked: None,
            phase: if gate { Phase::Absent } else { Phase::Creating },
            gate: if gate { Phase::Creating } else { Phase::Absent },
            abandoned: false,
            owned: false,
            held: false,
            deadline: Instant::now(),
            watching: None,
            watch_task: None,
            reaper: None,
        }
    }

    /// Forgets `token`'s entry if its session is not `conn`'s (its nodes ended with it).
    pub(super) fn drop_if_other_session(
        nodes: &mut HashMap<Token, Node>,
        token: Token,
        conn: &Conn,
    ) {
        if nodes.get(&token).is_some_and(|n| n.session != conn.session) {
            if let Some(mut n) = nodes.remove(&token) {
                n.stop_tasks();
            }
        }
    }

    /// Marks `token`'s entry held (owned by the registry, lease from now, no watch) and starts
    /// its reaper; returns the entry's gate node, which a holder no longer needs.
    pub(super) fn mark_held(
        self: &Arc<Self>,
        token: Token,
        lease: Duration,
    ) -> Result<Option<String>> {
        let gate = {
            let mut nodes = self.lock_nodes();
            let n = nodes
                .get_mut(&token)
                .ok_or_else(|| Error::unavailable(KIND, "the node was released meanwhile"))?;
            n.owned = true;
            n.held = true;
            n.deadline = Instant::now() + lease;
            if let Some(t) = n.watch_task.take() {
                t.abort();
            }
            n.watching = None;
            let gate = n.gate_path();
            n.gate = Phase::Absent;
            gate
        };
        self.install_reaper(token);
        Ok(gate)
    }

    /// Marks `token`'s entry handed to the registry while it waits; `false` when the entry
    /// went meanwhile.
    pub(super) fn mark_waiting(&self, token: Token) -> bool {
        match self.lock_nodes().get_mut(&token) {
            Some(n) => {
                n.owned = true;
                true
            }
            None => false,
        }
    }

    /// A mutex, reader or writer attempt (`role`) on the key's node `parent`.
    pub(super) async fn attempt_inner(
        self: &Arc<Self>,
        parent: &str,
        role: Role,
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
                Self::drop_if_other_session(&mut nodes, token, &conn);
                match nodes.get_mut(&token) {
                    Some(n) => match &n.phase {
                        Phase::Created { name, czxid } => Have::Known(name.clone(), *czxid),
                        _ => {
                            return Err(Error::unavailable(
                                KIND,
                                "an earlier attempt of this acquisition is still in flight",
                            ))
                        }
                    },
                    None => {
                        let node = self.new_node(&conn, parent, parent.to_owned(), false);
                        let id = node.id;
                        nodes.insert(token, node);
                        let target = Target {
                            dir: parent.to_owned(),
                            marker: role.marker(),
                            data: Vec::new(),
                            lists: vec![parent.to_owned()],
                        };
                        Have::Creating(self.spawn_create(
                            conn.clone(),
                            token,
                            id,
                            Which::Contender,
                            target,
                        ))
                    }
                }
            };
            let (own, czxid, children) = match have {
                Have::Creating(task) => {
                    let mut created = self
                        .timed("create", task)
                        .await?
                        .map_err(|e| Error::backend(KIND, format!("create task failed: {e}")))??;
                    let children = created.listings.pop().unwrap_or_default();
                    (created.name, created.czxid, children)
                }
                Have::Known(name, czxid) => {
                    // `sync` first: a server cut off from the leader cannot confirm our place.
                    let children = self.synced_list(&conn, parent).await?;
                    (name, czxid, children)
                }
            };
            let blocker = match place(&sort_contenders(&children), &own) {
                Place::Gone => {
                    // Our node is gone (deleted underneath): join the queue again.
                    if self.forget(token).is_some_and(|n| n.marked.is_some()) {
                        self.forget_marks();
                    }
                    continue;
                }
                Place::Behind(pred) => Some(Watch::Node(format!("{parent}/{pred}"))),
                Place::First => self.older_leases(&conn, parent, &children, czxid).await?,
            };
            let own_path = format!("{parent}/{own}");
            let Some(blocker) = blocker else {
                if !self.claim(&conn, token, &own_path).await? {
                    self.forget(token); // deleted as a dead waiter's: join again
                    continue;
                }
                let fence = u64::try_from(czxid).map_err(|_| {
                    Error::backend(KIND, format!("negative czxid {czxid} of {own}"))
                })?;
                self.mark_held(token, lease)?;
                return Ok(Attempt::Acquired { fence });
            };
            if !queued {
                // try_lock: leave at once.
                match self
                    .timed("delete", conn.client.delete(&own_path, None))
                    .await?
                {
                    Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                    Err(e) if session_gone(&e) => {}
                    Err(e) => return Err(zk_err(e)), // the guard deletes it in the background
                }
                self.forget(token);
                return Ok(Attempt::Busy { retry_after: None });
            }
            self.mark_node(&conn, token, parent, &own_path).await;
            if !self.watch(&conn, token, blocker).await? {
                continue; // what we wait for changed meanwhile: look again
            }
            if !self.mark_waiting(token) {
                continue;
            }
            return Ok(Attempt::Busy { retry_after: None });
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
        if n.creating() {
            n.abandoned = true; // the create task deletes them once it settles
            return;
        }
        let mut n = nodes.remove(&self.token).expect("present");
        drop(nodes);
        n.stop_tasks();
        for path in n.created_paths() {
            self.inner.delete_in_background(n.slot, n.session, path);
        }
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
