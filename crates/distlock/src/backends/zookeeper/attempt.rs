//! One acquisition attempt on a mutex, reader or writer: creating or finding the contender
//! node, the verdict of its place in the queue, then holding, leaving (`try_lock`) or watching;
//! and the guard that deletes the node when the call ends without handing it over.

use super::contender::{Target, Which};
use super::queue::{place, sort_for, Place, Role};
use super::semaphore::lease_data;
use super::waiters::holder_data;
use super::watch::Watch;
use super::*;
use crate::backends::contenders::attempt::{attempt, Look, Round};

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
        let permits = match name.kind() {
            LockKind::Semaphore { permits } if !name.is_election() => Some(permits),
            _ => None,
        };
        let (role, data) = match (name.is_election(), permits) {
            // A candidate's node carries its bare description for life (`LeaderLatch`'s id): it
            // is never marked as a waiter's, and it waits for its predecessor alone.
            (true, _) => (Role::Latch, owner.as_bytes().to_vec()),
            (false, Some(p)) => (Role::Mutex, lease_data(p, owner)),
            (false, None) => (Role::of(name.kind()), holder_data(owner)),
        };
        let mut round = ZkRound {
            inner: self,
            parent,
            token,
            lease,
            role,
            permits,
            data,
            conn: None,
            own_path: String::new(),
        };
        attempt(&mut round, queued, MAX_SETTLE).await
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
            n.hold(Instant::now() + lease);
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
}

/// One attempt of a contender: a mutex's, reader's, writer's or election candidate's (`role`)
/// node under the key's node, or a semaphore permit (`permits`, see `semaphore.rs`).
pub(super) struct ZkRound<'a> {
    pub(super) inner: &'a Arc<Inner>,
    pub(super) parent: &'a str,
    pub(super) token: Token,
    pub(super) lease: Duration,
    pub(super) role: Role,
    pub(super) permits: Option<u32>,
    /// The data of its node (a permit's: of its lease node).
    pub(super) data: Vec<u8>,
    /// The session of the last look, where its nodes live.
    pub(super) conn: Option<Arc<Conn>>,
    /// The own node of a mutex, reader, writer or candidate, found by the last look.
    pub(super) own_path: String,
}

impl ZkRound<'_> {
    /// The session of the last look.
    fn conn(&self) -> Result<Arc<Conn>> {
        self.conn
            .clone()
            .ok_or_else(|| Error::backend(KIND, "internal: no look before this step"))
    }

    /// The look of a mutex, reader, writer or candidate.
    async fn look_node(&mut self) -> Result<Look<Watch>> {
        let (inner, parent, token) = (self.inner, self.parent, self.token);
        let (role, latch) = (self.role, self.role == Role::Latch);
        let conn = inner.lease_conn(self.lease).await?;
        enum Have {
            Creating(tokio::task::JoinHandle<Result<Created>>),
            Known(String, i64),
        }
        let have = {
            let mut nodes = inner.nodes.lock();
            Inner::drop_if_other_session(&mut nodes, token, &conn);
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
                    let node = inner.new_node(&conn, parent, parent.to_owned(), false, &self.data);
                    let id = node.id;
                    nodes.insert(token, node);
                    let target = Target {
                        dir: parent.to_owned(),
                        marker: role.marker(),
                        data: self.data.clone(),
                        lists: vec![parent.to_owned()],
                    };
                    let create =
                        inner.spawn_create(conn.clone(), token, id, Which::Contender, target);
                    Have::Creating(create)
                }
            }
        };
        let (own, czxid, children) = match have {
            Have::Creating(task) => {
                let mut created = inner.created(task).await?;
                let children = created.listings.pop().unwrap_or_default();
                (created.name, created.czxid, children)
            }
            Have::Known(name, czxid) => {
                // `sync` first: a server cut off from the leader cannot confirm our place.
                let children = inner.synced_list(&conn, parent).await?;
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
                if inner.forget(token).is_some_and(|n| n.marked.is_some()) {
                    inner.forget_marks();
                }
                return Ok(Look::Again);
            }
            Place::Behind(pred) if latch => Some(Watch::Plain(format!("{parent}/{pred}"))),
            Place::Behind(pred) => Some(Watch::Node(format!("{parent}/{pred}"))),
            Place::First if latch => None,
            Place::First => inner.older_leases(&conn, parent, &children, czxid).await?,
        };
        self.own_path = format!("{parent}/{own}");
        self.conn = Some(conn);
        match blocker {
            Some(blocker) => Ok(Look::Waits(blocker, ahead)),
            None => fence_of(czxid, &own).map(Look::Holds),
        }
    }
}

impl Round for ZkRound<'_> {
    type Wait = Watch;

    async fn look(&mut self) -> Result<Look<Watch>> {
        match self.permits {
            Some(permits) => self.look_permit(permits).await,
            None => self.look_node().await,
        }
    }

    async fn hold(&mut self) -> Result<bool> {
        let (inner, token, conn) = (self.inner, self.token, self.conn()?);
        if self.permits.is_none() && !inner.claim(&conn, token, &self.own_path).await? {
            inner.forget(token); // deleted as a dead waiter's: join again
            return Ok(false);
        }
        // A permit holder gives Curator's `locks` mutex back.
        if let Some(gate) = inner.mark_held(token, self.lease)? {
            inner.delete_now(&conn, gate).await;
        }
        Ok(true)
    }

    async fn leave(&mut self) -> Result<()> {
        if self.permits.is_some() {
            return self.inner.remove(self.token).await.map(|_| ());
        }
        let conn = self.conn()?;
        let delete = conn.client.delete(&self.own_path, None);
        match self.inner.timed("delete", delete).await? {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
            Err(e) if session_gone(&e) => {}
            Err(e) => return Err(zk_err(e)), // the guard deletes it in the background
        }
        self.inner.forget(self.token);
        Ok(())
    }

    async fn refuse(&mut self, other: u32) -> Error {
        if let Err(e) = self.inner.remove(self.token).await {
            return e;
        }
        Error::config(format!(
            "semaphore at {} has holders with {other} permits; this one asks for {}",
            crate::ShortKey(self.parent),
            self.permits.unwrap_or(0)
        ))
    }

    async fn wait(&mut self, what: Watch, _ahead: Option<u32>) -> Result<bool> {
        let (inner, token, conn) = (self.inner, self.token, self.conn()?);
        if self.permits.is_none() && self.role != Role::Latch {
            inner
                .mark_node(&conn, token, self.parent, &self.own_path)
                .await;
        }
        Ok(inner.watch(&conn, token, what).await? && inner.mark_waiting(token))
    }

    fn unsettled(&self) -> Result<Attempt> {
        let what = match self.permits {
            Some(_) => "the semaphore's nodes",
            None => "the lock's nodes",
        };
        let msg = format!("{what} kept changing under this attempt");
        Err(Error::unavailable(KIND, msg))
    }
}

/// The fence of a holder node: its `czxid`.
pub(super) fn fence_of(czxid: i64, own: &str) -> Result<u64> {
    u64::try_from(czxid)
        .map_err(|_| Error::backend(KIND, format!("negative czxid {czxid} of {own}")))
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
