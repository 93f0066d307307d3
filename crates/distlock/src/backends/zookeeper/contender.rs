//! A contender's nodes: the entry this process keeps per owner token ([`Node`]: its nodes and
//! their phases, its tasks) and creating those nodes in Curator's protected mode, with the
//! listings that come back in the same round trip.

use super::queue::protected_prefix;
use super::*;
use crate::backends::contenders::Contender;

/// Entry ids of [`Node`].
static NEXT_NODE_ID: AtomicU64 = AtomicU64::new(1);

/// A contender of this process (one acquisition, by owner token), in the family's
/// [`Contender`]: held until its deadline or not (ZooKeeper's reaper only ends holds).
pub(super) type Node = Contender<Nodes>;

/// A contender's node and, for a semaphore permit, its node in Curator's `locks` mutex that
/// admits one permit taker at a time.
pub(super) struct Nodes {
    /// Tells this entry from an earlier one of the same token (a create task settles only the
    /// entry it was started for).
    pub(super) id: u64,
    /// The key's node (`<root>/<key>`).
    pub(super) parent: String,
    /// Where the contender node lives: the key's node for a mutex, reader or writer, its
    /// `leases` folder for a semaphore permit.
    pub(super) dir: String,
    /// The session timeout of its session (the lease it was created for).
    pub(super) slot: Duration,
    /// The session that created it: the node ends with that session.
    pub(super) session: i64,
    /// The data version of the contender node while it carries its waiter's liveness mark
    /// (see `waiters.rs`).
    pub(super) marked: Option<i32>,
    /// The data a holder's contender node carries (its owner's description): what `claim`
    /// writes back over a waiter's mark.
    pub(super) data: Vec<u8>,
    /// The contender node (a permit's lease node).
    pub(super) phase: Phase,
    /// A semaphore permit's node in the key's `locks` folder, while it takes or holds that
    /// mutex (it gives it back once it holds its permit); [`Phase::Absent`] otherwise.
    pub(super) gate: Phase,
    /// Nobody will take the nodes: the create task in flight deletes them when it settles.
    pub(super) abandoned: bool,
    /// An acquisition call returned it to the registry (as holder or waiter), which will
    /// release it or leave the queue. Until then the backend cleans it up itself.
    pub(super) owned: bool,
    /// What is being watched while waiting (see `watch::Watch::key`).
    pub(super) watching: Option<String>,
    pub(super) watch_task: Option<AbortHandle>,
}

/// One node of a [`Node`]: not made (yet), being created, or created.
pub(super) enum Phase {
    Absent,
    /// The create is in flight (in a task of its own, so that it settles whatever happens to
    /// the caller).
    Creating,
    Created {
        name: String,
        czxid: i64,
    },
}

impl Nodes {
    pub(super) fn path(&self) -> Option<String> {
        match &self.phase {
            Phase::Created { name, .. } => Some(format!("{}/{name}", self.dir)),
            _ => None,
        }
    }

    pub(super) fn gate_path(&self) -> Option<String> {
        match &self.gate {
            Phase::Created { name, .. } => Some(format!("{}/{GATE_DIR}/{name}", self.parent)),
            _ => None,
        }
    }

    /// Every node of this contender that exists on the server (the gate first).
    pub(super) fn created_paths(&self) -> Vec<String> {
        self.gate_path().into_iter().chain(self.path()).collect()
    }

    pub(super) fn creating(&self) -> bool {
        matches!(self.phase, Phase::Creating) || matches!(self.gate, Phase::Creating)
    }

    pub(super) fn stop_tasks(&mut self) {
        if let Some(t) = self.watch_task.take() {
            t.abort();
        }
    }
}

/// The outcome of a create: our node, and the children of the directories listed right after
/// it (in the order asked for).
pub(super) struct Created {
    pub(super) name: String,
    pub(super) czxid: i64,
    pub(super) listings: Vec<Vec<String>>,
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

/// The children a listing found; none when the folder does not exist.
fn children(
    listed: std::result::Result<Vec<String>, zookeeper_client::Error>,
) -> Result<Vec<String>> {
    match listed {
        Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
        other => other.map_err(zk_err),
    }
}

impl Inner {
    pub(super) async fn list(&self, conn: &Conn, parent: &str) -> Result<Vec<String>> {
        children(
            self.timed("get children", conn.client.list_children(parent))
                .await?,
        )
    }

    /// Lists children after a `sync`, so that the answer is as new as the leader's.
    pub(super) async fn synced_list(&self, conn: &Conn, parent: &str) -> Result<Vec<String>> {
        let sync = conn.client.sync(parent);
        let list = conn.client.list_children(parent);
        let (synced, listed) = self
            .timed("sync and get children", async { tokio::join!(sync, list) })
            .await?;
        children(synced.and(listed))
    }

    pub(super) fn parent_known(&self, parent: &str) -> bool {
        self.parents.locked().contains(parent)
    }

    pub(super) fn set_parent_known(&self, parent: &str, known: bool) {
        let mut p = self.parents.locked();
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
            let mut nodes = inner.nodes.lock();
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

    /// What a create started by [`spawn_create`](Self::spawn_create) made.
    pub(super) async fn created(
        &self,
        task: tokio::task::JoinHandle<Result<Created>>,
    ) -> Result<Created> {
        let joined = self.timed("create", task).await?;
        joined.map_err(|e| Error::backend(KIND, format!("create task failed: {e}")))?
    }

    /// A new entry for `token` of session `conn`, its first node being created: the gate of a
    /// semaphore permit (`gate`), else the contender in `dir`.
    pub(super) fn new_node(
        &self,
        conn: &Conn,
        parent: &str,
        dir: String,
        gate: bool,
        data: &[u8],
    ) -> Node {
        Contender::new(Nodes {
            id: NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed),
            parent: parent.to_owned(),
            dir,
            slot: conn.slot,
            session: conn.session,
            marked: None,
            data: data.to_vec(),
            phase: if gate { Phase::Absent } else { Phase::Creating },
            gate: if gate { Phase::Creating } else { Phase::Absent },
            abandoned: false,
            owned: false,
            watching: None,
            watch_task: None,
        })
    }
}
