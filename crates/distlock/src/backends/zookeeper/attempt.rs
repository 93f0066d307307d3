//! One acquisition attempt on a mutex, reader or writer: creating or finding the contender
//! node, the verdict of its place in the queue, then holding, leaving (`try_lock`) or watching;
//! and the guard that deletes the node when the call ends without handing it over.

use super::contender::{Target, Which};
use super::queue::{place, sort_for, Place, Role};
use super::waiters::holder_data;
use super::watch::Watch;
use super::*;

impl Inner {
    /// One acquisition attempt; `queued` callers stay in the queue when the lock is busy.
    pub(super) async fn attempt(self: &Arc<Self>, request: &AcquireRequest) -> Result<Attempt> {
        let (name, token, lease) = (&request.name, request.token, request.lease);
        let queued = request.queued();
        let owner = request.owner_str();
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
        let mut res = self
            .attempt_kind(&parent, name, token, lease, queued, owner)
            .await;
        while let Err(e) = &res {
            if !e.is_retryable() || tokio::time::Instant::now() + pause >= deadline {
                break;
            }
            tracing::debug!(error = %e, "attempt failed on a broken connection; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
            res = self
                .attempt_kind(&parent, name, token, lease, queued, owner)
                .await;
        }
        if res.is_ok() {
            guard.armed = false;
        }
        res
    }

    async fn attempt_kind(
        self: &Arc<Self>,
        parent: &str,
        name: &LockName,
        token: Token,
        lease: Duration,
        queued: bool,
        owner: &str,
    ) -> Result<Attempt> {
        if name.is_election() {
            return self
                .attempt_inner(parent, Role::Latch, token, lease, queued, owner)
                .await;
        }
        match name.kind() {
            LockKind::Semaphore { permits } => {
                self.attempt_permit(parent, permits, token, lease, queued, owner)
                    .await
            }
            other => {
                self.attempt_inner(parent, Role::of(other), token, lease, queued, owner)
                    .await
            }
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
            let mut nodes = self.nodes.lock();
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
        match self.nodes.lock().get_mut(&token) {
            Some(n) => {
                n.owned = true;
                true
            }
            None => false,
        }
    }

    /// A mutex, reader, writer or election candidate attempt (`role`) on the key's node
    /// `parent`. A candidate's node carries its bare description for life (`LeaderLatch`'s
    /// id): it is never marked as a waiter's, and it waits for its predecessor alone.
    pub(super) async fn attempt_inner(
        self: &Arc<Self>,
        parent: &str,
        role: Role,
        token: Token,
        lease: Duration,
        queued: bool,
        owner: &str,
    ) -> Result<Attempt> {
        let latch = role == Role::Latch;
        let data = match latch {
            true => owner.as_bytes().to_vec(),
            false => holder_data(owner),
        };
        for _ in 0..MAX_SETTLE {
            let conn = self.lease_conn(lease).await?;
            enum Have {
                Creating(tokio::task::JoinHandle<Result<Created>>),
                Known(String, i64),
            }
            let have = {
                let mut nodes = self.nodes.lock();
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
                        let node = self.new_node(&conn, parent, parent.to_owned(), false, &data);
                        let id = node.id;
                        nodes.insert(token, node);
                        let target = Target {
                            dir: parent.to_owned(),
                            marker: role.marker(),
                            data: data.clone(),
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
                    let mut created = self.created(task).await?;
                    let children = created.listings.pop().unwrap_or_default();
                    (created.name, created.czxid, children)
                }
                Have::Known(name, czxid) => {
                    // `sync` first: a server cut off from the leader cannot confirm our place.
                    let children = self.synced_list(&conn, parent).await?;
                    (name, czxid, children)
                }
            };
            let sorted = sort_for(role, &children);
            // The watch on the blocker wakes this waiter in turn (see `Attempt::Busy::ahead`).
            let ahead = sorted
                .iter()
                .position(|c| c.name == own)
                .and_then(|i| u32::try_from(i).ok());
            let blocker = match place(&sorted, &own) {
                Place::Gone => {
                    // Our node is gone (deleted underneath): join the queue again.
                    if self.forget(token).is_some_and(|n| n.marked.is_some()) {
                        self.forget_marks();
                    }
                    continue;
                }
                Place::Behind(pred) if latch => Some(Watch::Plain(format!("{parent}/{pred}"))),
                Place::Behind(pred) => Some(Watch::Node(format!("{parent}/{pred}"))),
                Place::First if latch => None,
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
                return Ok(Attempt::BUSY);
            }
            if !latch {
                self.mark_node(&conn, token, parent, &own_path).await;
            }
            if !self.watch(&conn, token, blocker).await? {
                continue; // what we wait for changed meanwhile: look again
            }
            if !self.mark_waiting(token) {
                continue;
            }
            return Ok(Attempt::Busy {
                retry_after: None,
                ahead,
            });
        }
        Err(Error::unavailable(
            KIND,
            "the lock's nodes kept changing under this attempt",
        ))
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
        let mut nodes = self.inner.nodes.lock();
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
        self.inner.delete_all_in_background(&n);
    }
}
