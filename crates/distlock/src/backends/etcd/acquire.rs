//! One acquisition attempt and the deletion of a key: creating the key, reading the queue,
//! watching the predecessor, and cleaning up after failures (zombies).

use super::kinds::{self, judge, key_of, value_of, Verdict};
use super::options::KIND;
use super::pool::waiter_class;
use super::queue::{ascending, before, class_of, every_before, lock_dir, newest, with_values};
use super::session::Session;
use super::state::{Entry, Shared, Slot};
use super::watch::WatchTarget;
use crate::backend::{Attempt, LockKind, LockName, Token};
use crate::backends::contenders::attempt::{attempt, Look as Next, Round};
use crate::backends::contenders::reaper::retry_until_gone;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backends::contenders::{Locked, Stage};
use crate::error::{Error, Result};

use super::pb;
use super::rpc_error::{is_lease_not_found, map_err};

/// The contenders before revision `rev`, as far as `asc` (the oldest keys of the directory,
/// ascending, with the directory's count) shows them: exact when the key of `rev` is among
/// them, else the count less that key, an upper bound. A waiter far back then polls at the
/// slowest pace, and its predecessor's watch wakes it in turn.
fn ahead_of(asc: &pb::RangeResponse, rev: i64) -> Option<u32> {
    match asc.kvs.iter().position(|kv| kv.create_revision >= rev) {
        Some(i) => count(i),
        None => u32::try_from(asc.count.saturating_sub(1)).ok(),
    }
}

/// How many contenders ahead make a waiter watch its predecessor from the revision of its read
/// instead of reading again (see the attempt loop): that many hand-overs take longer than
/// etcd's 100 ms catch-up of a watch that starts in the past.
const FAR_BACK: u32 = 32;

/// How long a release that left the lock to another contender makes the next waiting try of
/// the same lock expect it busy (see `Shared::expects_busy`).
const HANDED_FOR: Duration = Duration::from_secs(5);

fn count(n: usize) -> Option<u32> {
    u32::try_from(n).ok()
}

/// What a queued key's look at the queue found (see `Shared::look_behind`).
enum Look {
    /// Its own key is gone.
    Gone,
    /// A lease vanished under the transaction: look again.
    Again,
    /// The verdict, the contenders ahead, and the revision of the read.
    Seen(Verdict, Option<u32>, i64),
}

/// Records that the key of `e` is attached to `to`, keeping each session's count of keys
/// attached to it but named after another (a session with such keys is not retired).
fn attach(e: &mut Entry, to: Arc<Session>) {
    detach(e);
    if e.session.as_ref().is_none_or(|n| !Arc::ptr_eq(n, &to)) {
        to.attached.fetch_add(1, Ordering::AcqRel);
    }
    e.attached = Some(to);
}

/// Forgets the session the key of `e` is attached to, and the count (see [`attach`]).
fn detach(e: &mut Entry) {
    if let Some(old) = e.attached.take() {
        if e.session.as_ref().is_none_or(|n| !Arc::ptr_eq(n, &old)) {
            old.attached.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn attempt_locked(
        &self,
        slot: &Arc<Slot>,
        e: &mut Entry,
        name: LockName,
        token: Token,
        lease: Duration,
        queued: bool,
        owner: &str,
    ) -> Result<Attempt> {
        let sent = Instant::now();
        e.touched = Some(sent);
        if e.stage == Stage::Zombie {
            self.delete_own(e, token).await?;
            self.forget_key(e, token);
            e.stage = Stage::New;
        }
        if e.stage == Stage::Done {
            e.stage = Stage::New;
        }
        if e.name.is_none() {
            e.dir = lock_dir(&name);
            e.value = match name.is_election() {
                // `concurrency.Election`'s value: the candidate's description, nothing else.
                true => owner.as_bytes().to_vec(),
                false => value_of(name.kind(), token, owner),
            };
            e.name = Some(name);
        }
        let kind = e.name.as_ref().map_or(LockKind::Mutex, LockName::kind);
        let mut round = EtcdRound {
            shared: self,
            slot,
            e,
            token,
            lease,
            queued,
            kind,
            sent,
            at: 0,
        };
        // Past eight looks that found the queue changing, the registry comes back after the
        // next notification or poll: busy is always safe.
        attempt(&mut round, queued, 8).await
    }

    /// One look at the queue by the queued key of `e` (a mutex's or writer's), in one
    /// transaction: when no key of the directory is older (the head, as a waiter woken by its
    /// predecessor's deletion mostly is), it holds, and its key moves to a session at least as
    /// long as `lease` at once (see [`on_holder_session`](Self::on_holder_session)); else the
    /// keys before it, youngest first, show its predecessor. Without `head`, only the keys
    /// before it are read (the holder then moves in `on_holder_session`).
    async fn look_behind(&self, e: &mut Entry, lease: Duration, head: bool) -> Result<Look> {
        let rev = e.create_rev;
        let own = pb::create_revision_is(e.key.as_bytes(), rev);
        if !head {
            let older = vec![pb::op_range(before(&e.dir, rev))];
            let resp = self.txn(pb::txn(vec![own], older, vec![])).await?;
            if !resp.succeeded {
                return Ok(Look::Gone);
            }
            let Some(desc) = pb::range_at(&resp, 0) else {
                return Err(Error::backend(KIND, "short transaction reply"));
            };
            let at = resp.header.as_ref().map_or(0, |h| h.revision);
            let (verdict, ahead) = self.view_behind(&e.dir, rev, desc).await?;
            return Ok(Look::Seen(verdict, ahead, at));
        }
        let to = self.holder_session(e, lease).await?;
        let (key, dir) = (e.key.as_bytes(), e.dir.as_bytes());
        let first = vec![own, pb::none_created_before(dir, pb::prefix_end(dir), rev)];
        let moved = to.iter().map(|s| pb::op_put(key, &e.value, s.id));
        let own = pb::RangeRequest {
            keys_only: true,
            ..pb::range_key(key)
        };
        let txn = pb::txn(
            first,
            moved.collect(),
            vec![pb::op_range(own), pb::op_range(before(&e.dir, rev))],
        );
        let resp = match self.client.txn(txn).await {
            Ok(r) => r,
            Err(err) if is_lease_not_found(&err) => {
                if let Some(to) = &to {
                    let _ = to.keep_alive_now(self.opts.request_timeout).await;
                }
                return Ok(Look::Again);
            }
            Err(err) => return Err(map_err(err)),
        };
        let at = resp.header.as_ref().map_or(0, |h| h.revision);
        if resp.succeeded {
            if let Some(to) = to {
                attach(e, to);
            }
            return Ok(Look::Seen(Verdict::Holds, Some(0), at));
        }
        let kept = pb::range_at(&resp, 0)
            .and_then(|r| r.kvs.first())
            .is_some_and(|kv| kv.create_revision == rev);
        if !kept {
            return Ok(Look::Gone);
        }
        let Some(desc) = pb::range_at(&resp, 1) else {
            return Err(Error::backend(KIND, "short transaction reply"));
        };
        let (verdict, ahead) = self.view_behind(&e.dir, rev, desc).await?;
        Ok(Look::Seen(verdict, ahead, at))
    }

    /// The session the key of `e`, about to hold, moves to: `None` when the one it is attached
    /// to lasts at least `lease` already. Not counted as attached yet (see [`attach`]).
    async fn holder_session(&self, e: &Entry, lease: Duration) -> Result<Option<Arc<Session>>> {
        let class = class_of(lease, self.opts.min_session_ttl);
        if e.attached
            .as_ref()
            .is_some_and(|a| a.class >= class && !a.is_dead())
        {
            return Ok(None);
        }
        let to = self.session_at_least(class).await?;
        to.attached.fetch_sub(1, Ordering::AcqRel);
        Ok(Some(to))
    }

    /// Makes sure the key of `e` (created at `rev`), about to hold, is attached to a session
    /// at least as long as its lease's: a key that waited on the waiters' short lease moves to
    /// one (a put keeps its name, which stays the waiter lease's id, and its create revision,
    /// so its place). `false` when the key is gone (its waiter lease ran out) or a lease
    /// vanished: the caller looks again.
    async fn on_holder_session(&self, e: &mut Entry, rev: i64, lease: Duration) -> Result<bool> {
        let Some(to) = self.holder_session(e, lease).await? else {
            return Ok(true);
        };
        let key = e.key.as_bytes();
        let txn = pb::txn(
            vec![pb::create_revision_is(key, rev)],
            vec![pb::op_put(key, &e.value, to.id)],
            vec![],
        );
        match self.client.txn(txn).await {
            Ok(r) if r.succeeded => {
                attach(e, to);
                Ok(true)
            }
            Ok(_) => {
                tracing::debug!(key = %e.key, "own key gone at the head of the queue (waiter lease expired); queueing again");
                e.requeue();
                Ok(false)
            }
            Err(err) if is_lease_not_found(&err) => {
                let _ = to.keep_alive_now(self.opts.request_timeout).await;
                Ok(false)
            }
            Err(err) => Err(map_err(err)),
        }
    }

    /// Watches `pred`, found by a read at revision `at` (0: unknown), for its changes after
    /// that read.
    pub(super) async fn watch_pred(
        &self,
        slot: &Arc<Slot>,
        pred: WatchTarget,
        at: i64,
    ) -> Result<()> {
        if let Some(old) = slot.take_watch() {
            self.watches.cancel(old);
        }
        let handle = self
            .watches
            .create(
                pred,
                if at > 0 { at + 1 } else { 0 },
                slot.signal.clone(),
                self.opts.request_timeout,
            )
            .await?;
        *slot.watch.locked() = Some(handle);
        if !slot.subscribed() {
            if let Some(w) = slot.take_watch() {
                self.watches.cancel(w);
            }
        }
        Ok(())
    }

    /// Deletes the own key if it still holds what we wrote; returns whether it was there.
    pub(super) async fn delete_own(&self, e: &Entry, _token: Token) -> Result<bool> {
        if let Some((alt, _)) = &e.alt {
            let key = alt.as_bytes();
            let txn = pb::txn(
                vec![pb::value_is(key, &e.value)],
                vec![pb::op_delete(key)],
                vec![],
            );
            self.txn(txn).await?;
        }
        if e.key.is_empty() {
            return Ok(false);
        }
        let key = e.key.as_bytes();
        let txn = pb::txn(e.owned(key), vec![pb::op_delete(key)], vec![]);
        Ok(self.txn(txn).await?.succeeded)
    }

    /// Deletes the own held key like [`delete_own`](Self::delete_own), and counts in the same
    /// transaction the keys left in its directory: any left means the lock went to a waiter,
    /// which [`expects_busy`](Self::expects_busy) remembers. The count reads only etcd's index.
    async fn delete_held(&self, e: &Entry, token: Token) -> Result<bool> {
        if e.alt.is_some() || e.key.is_empty() {
            return self.delete_own(e, token).await;
        }
        let key = e.key.as_bytes();
        let left = pb::RangeRequest {
            range_end: pb::prefix_end(e.dir.as_bytes()),
            count_only: true,
            ..pb::range_key(e.dir.as_bytes())
        };
        let txn = pb::txn(
            e.owned(key),
            vec![pb::op_delete(key), pb::op_range(left)],
            vec![],
        );
        let resp = self.txn(txn).await?;
        let handed = resp.succeeded && pb::range_at(&resp, 1).is_some_and(|r| r.count > 0);
        let exclusive = e
            .name
            .as_ref()
            .is_some_and(|n| !n.is_election() && n.kind().is_exclusive());
        let mut map = self.handed.locked();
        match handed && exclusive {
            true => {
                let now = Instant::now();
                // Entries of locks this instance does not take again go after a while.
                if map.len() >= 1024 {
                    map.retain(|_, t| now.duration_since(*t) < HANDED_FOR);
                }
                map.insert(e.dir.clone(), now);
            }
            false => {
                map.remove(&e.dir);
            }
        }
        Ok(resp.succeeded)
    }

    /// Whether this instance's last release of `name` left it to another contender, recently:
    /// then a waiting try answers busy without asking (once; the queued attempt that follows
    /// asks the server, so a wrong guess costs nothing but that attempt).
    pub(super) fn expects_busy(&self, name: &LockName) -> bool {
        if name.is_election() || !name.kind().is_exclusive() {
            return false;
        }
        let mut map = self.handed.locked();
        map.remove(&lock_dir(name))
            .is_some_and(|t| t.elapsed() < HANDED_FOR)
    }

    /// The key is gone from the server: free its name for other tokens of this instance.
    pub(super) fn forget_key(&self, e: &mut Entry, token: Token) {
        if let Some((_, w)) = e.alt.take() {
            w.remove_user(&e.dir, token);
        }
        detach(e);
        if let Some(s) = e.session.take() {
            s.remove_user(&e.dir, token);
        }
        e.maybe_created = false;
        e.create_rev = 0;
        e.deadline = None;
    }

    /// Deletes the key of `e` and forgets it (and the slot, when `forget_slot`); a failed deletion is
    /// retried in the background.
    pub(super) async fn delete_and_forget(
        &self,
        slot: &Arc<Slot>,
        e: &mut Entry,
        token: Token,
        forget_slot: bool,
    ) {
        match self.delete_own(e, token).await {
            Ok(_) => self.done(slot, e, token, forget_slot),
            Err(err) => self.zombify(slot, e, token, err),
        }
    }

    /// Nothing of `e` is left on the server: forget its key (and the slot, when `forget_slot`).
    fn done(&self, slot: &Arc<Slot>, e: &mut Entry, token: Token, forget_slot: bool) {
        e.stage = Stage::Done;
        self.forget_key(e, token);
        if forget_slot {
            self.slots.forget_if(token, |s| Arc::ptr_eq(s, slot));
        }
    }

    /// Deleting the key of `e` failed: it is retried in the background until it is gone
    /// (or an attempt of the token deletes it first, which it does before queueing again).
    pub(super) fn zombify(&self, slot: &Arc<Slot>, e: &mut Entry, token: Token, err: Error) {
        tracing::debug!(key = %e.key, error = %err, "deleting the lock key failed; retrying in the background");
        e.stage = Stage::Zombie;
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let slot = slot.clone();
        retry_until_gone(&me, move |shared: Arc<Shared>| {
            let slot = slot.clone();
            async move { shared.delete_zombie(&slot, token).await }
        });
    }

    /// One try of a zombie's deletion; `true` when no zombie is left to delete. The name is
    /// freed only once the key is gone: another token of this instance would find it taken.
    async fn delete_zombie(&self, slot: &Arc<Slot>, token: Token) -> bool {
        let mut e = slot.entry.lock().await;
        if e.stage != Stage::Zombie {
            return true;
        }
        match self.delete_own(&e, token).await {
            Ok(_) => {
                self.done(slot, &mut e, token, !slot.subscribed());
                true
            }
            Err(err) => {
                tracing::debug!(key = %e.key, error = %err, "deleting the lock key failed; retrying");
                false
            }
        }
    }

    pub(super) async fn finish_locked(
        &self,
        slot: &Arc<Slot>,
        e: &mut Entry,
        token: Token,
    ) -> Result<(bool, bool)> {
        let held = e.stage == Stage::Held;
        if let Some(w) = slot.take_watch() {
            self.watches.cancel(w);
        }
        let on_server =
            matches!(e.stage, Stage::Queued | Stage::Held | Stage::Zombie) || e.maybe_created;
        if !on_server {
            self.done(slot, e, token, true);
            return Ok((held, false));
        }
        let deleted = match held {
            true => self.delete_held(e, token).await,
            false => self.delete_own(e, token).await,
        };
        match deleted {
            Ok(deleted) => {
                self.done(slot, e, token, true);
                Ok((held, deleted))
            }
            Err(err) => {
                let msg = err.to_string();
                self.zombify(slot, e, token, err);
                Err(Error::unavailable(
                    KIND,
                    format!("{msg} (the key will be deleted in the background)"),
                ))
            }
        }
    }
}

/// One attempt of the key of an entry, on the family's attempt loop.
struct EtcdRound<'a> {
    shared: &'a Shared,
    slot: &'a Arc<Slot>,
    e: &'a mut Entry,
    token: Token,
    lease: Duration,
    queued: bool,
    kind: LockKind,
    /// When the attempt started: the registry counts the lease from then.
    sent: Instant,
    /// The revision of the last look's read.
    at: i64,
}

impl Round for EtcdRound<'_> {
    /// The key (or, for a permit behind as many permits as it has, the range of permits) to
    /// watch; none when the ranges raced with a change of the queue (the holder is older, so
    /// somebody precedes it): look again.
    type Wait = Option<WatchTarget>;

    async fn look(&mut self) -> Result<Next<Option<WatchTarget>>> {
        let (s, slot, e) = (self.shared, self.slot, &mut *self.e);
        let (token, lease, queued, kind) = (self.token, self.lease, self.queued, self.kind);
        // Readers and permits look at every key before theirs; a mutex or writer only at the
        // oldest and at its predecessor.
        let shares = !kind.is_exclusive();

        let (verdict, ahead, at) = if e.stage == Stage::New {
            // A queued key that finds older keys waits on a short waiter lease (named after
            // it, as `concurrency.Mutex` names keys), so that a waiter that dies leaves the
            // queue within the waiter ttl; a key that holds at once goes on a session of its
            // lease. Both names are reserved until the transaction says which one it is.
            let class = class_of(lease, s.opts.min_session_ttl);
            if e.session
                .as_ref()
                .is_some_and(|s| s.is_dead() || s.class != class)
            {
                detach(e);
                if let Some(old) = e.session.take() {
                    old.remove_user(&e.dir, token);
                }
            }
            let named = match e.session.clone() {
                Some(s) => s,
                None => {
                    let s = s.session_of_class(&e.dir, token, class).await?;
                    e.session = Some(s.clone());
                    s
                }
            };
            let wclass = waiter_class(s.opts.waiter_ttl);
            // The waiter name a create whose answer was lost may have used is still ours.
            let earlier = e.alt.as_ref().map(|(_, w)| w.clone());
            let waiter = match (queued && class > wclass, earlier) {
                (false, _) => None,
                (true, Some(w)) if !w.is_dead() => Some(w),
                (true, _) => Some(s.session_of_class(&e.dir, token, wclass).await?),
            };
            let key_s = key_of(kind, &e.dir, named.id);
            let key_w = waiter.as_ref().map(|w| key_of(kind, &e.dir, w.id));
            // A permit reads the others' numbers of permits in their values.
            let queue = || match kind {
                LockKind::Semaphore { .. } => with_values(ascending(&e.dir)),
                _ => ascending(&e.dir),
            };
            let mut absent = vec![pb::create_revision_is(key_s.as_bytes(), 0)];
            let mut read = vec![pb::op_range(pb::range_key(key_s.as_bytes()))];
            let put = match (&waiter, &key_w) {
                (Some(w), Some(kw)) => {
                    absent.push(pb::create_revision_is(kw.as_bytes(), 0));
                    read.push(pb::op_range(pb::range_key(kw.as_bytes())));
                    pb::op_txn(pb::txn(
                        vec![pb::range_is_empty(
                            e.dir.as_bytes(),
                            pb::prefix_end(e.dir.as_bytes()),
                        )],
                        vec![pb::op_put(key_s.as_bytes(), &e.value, named.id)],
                        vec![pb::op_put(kw.as_bytes(), &e.value, w.id)],
                    ))
                }
                _ => pb::op_put(key_s.as_bytes(), &e.value, named.id),
            };
            let n_read = read.len();
            read.push(pb::op_range(queue()));
            // A mutex or writer whose key is new sees its predecessor among the newest keys.
            let after_put = match shares {
                true => queue(),
                false => newest(&e.dir),
            };
            let txn = pb::txn(absent, vec![put, pb::op_range(after_put)], read);
            e.maybe_created = true;
            let resp = match s.client.txn(txn).await {
                Ok(r) => r,
                Err(err) if is_lease_not_found(&err) => {
                    e.maybe_created = false;
                    // One of the two leases is gone: a keep-alive finds out which (and
                    // retires it), and the next round picks a live one.
                    let t = s.opts.request_timeout;
                    let _ = named.keep_alive_now(t).await;
                    if let Some(w) = &waiter {
                        let _ = w.keep_alive_now(t).await;
                        w.remove_user(&e.dir, token);
                    }
                    return Ok(Next::Again);
                }
                Err(err) => {
                    // Either name may exist now: keep both for the clean-up.
                    e.key = key_s;
                    e.alt = waiter.zip(key_w).map(|(w, k)| (k, w));
                    return Err(map_err(err));
                }
            };
            if let Some((_, w)) = e.alt.take() {
                if waiter.as_ref().is_none_or(|x| !Arc::ptr_eq(x, &w)) {
                    w.remove_user(&e.dir, token);
                }
            }
            // Which of the two keys is ours: (its session, whether it is the waiter's).
            let (rev, on_waiter) = if resp.succeeded {
                let waits =
                    waiter.is_some() && pb::txn_at(&resp, 0).is_some_and(|inner| !inner.succeeded);
                (resp.header.as_ref().map_or(0, |h| h.revision), waits)
            } else {
                let found = (0..n_read).find_map(|i| {
                    let kv = pb::range_at(&resp, i).and_then(|g| g.kvs.first())?;
                    Some((i == 1, kv.clone()))
                });
                match found {
                    Some((w, kv)) if kv.value == e.value => (kv.create_revision, w),
                    Some(_) => {
                        e.maybe_created = false;
                        if let Some(w) = &waiter {
                            w.remove_user(&e.dir, token);
                        }
                        return Err(Error::backend(
                            KIND,
                            format!("key {key_s} belongs to another owner (lease id collision)"),
                        ));
                    }
                    // Deleted in between: try again.
                    None => {
                        if let Some(w) = &waiter {
                            w.remove_user(&e.dir, token);
                        }
                        return Ok(Next::Again);
                    }
                }
            };
            match (on_waiter, waiter, key_w) {
                (true, Some(w), Some(kw)) => {
                    detach(e);
                    named.remove_user(&e.dir, token);
                    e.key = kw;
                    e.session = Some(w.clone());
                    attach(e, w);
                }
                (_, w, _) => {
                    if let Some(w) = w {
                        w.remove_user(&e.dir, token);
                    }
                    e.key = key_s;
                    attach(e, named);
                }
            }
            let asc_at = if resp.succeeded { 1 } else { n_read };
            e.maybe_created = false;
            e.create_rev = rev;
            e.stage = Stage::Queued;
            let Some(asc) = pb::range_at(&resp, asc_at) else {
                return Err(Error::backend(KIND, "short transaction reply"));
            };
            let at = resp.header.as_ref().map_or(0, |h| h.revision);
            let (verdict, ahead) = if shares {
                let before = s.before(&e.dir, rev, Some(asc)).await?;
                (judge(kind, &e.dir, &before), count(before.len()))
            } else if resp.succeeded {
                s.view_behind(&e.dir, rev, asc).await?
            } else {
                (s.view(&e.dir, rev, asc).await?, ahead_of(asc, rev))
            };
            (verdict, ahead, at)
        } else if !shares {
            // Only a waiter that may be at the head (woken since its last look, or next in
            // line then) checks for it in the look, at the cost of a second read of the
            // directory when it is not: a far waiter's poll reads it once.
            let (was_ahead, gen) = e.seen;
            let head = gen != slot.signal.generation() || was_ahead.is_none_or(|a| a <= 1);
            match s.look_behind(e, lease, head).await? {
                Look::Gone => {
                    tracing::debug!(key = %e.key, "own key gone while waiting (lease expired or key deleted); queueing again");
                    e.requeue();
                    return Ok(Next::Again);
                }
                Look::Again => return Ok(Next::Again),
                Look::Seen(verdict, ahead, at) => (verdict, ahead, at),
            }
        } else {
            // Queued (or held): one linearizable read confirms the own key and ranges the
            // queue around it (for a reader or permit: every key before it).
            let txn = pb::txn(
                vec![pb::create_revision_is(e.key.as_bytes(), e.create_rev)],
                vec![pb::op_range(every_before(&e.dir, e.create_rev))],
                vec![],
            );
            let resp = s.txn(txn).await?;
            let at = resp.header.as_ref().map_or(0, |h| h.revision);
            if !resp.succeeded {
                tracing::debug!(key = %e.key, "own key gone while waiting (lease expired or key deleted); queueing again");
                e.requeue();
                return Ok(Next::Again);
            }
            let Some(all) = pb::range_at(&resp, 0) else {
                return Err(Error::backend(KIND, "short transaction reply"));
            };
            let before = kinds::queued(e.dir.as_bytes(), &all.kvs, false);
            (judge(kind, &e.dir, &before), count(before.len()), at)
        };
        self.at = at;
        // Every look leaves the key's create revision in the entry.
        Ok(match verdict {
            Verdict::Gone => {
                // Our own key is always in the queue; an empty view means it just went.
                e.requeue();
                Next::Again
            }
            Verdict::Disagrees(other) => Next::Disagrees(other),
            Verdict::Holds => Next::Holds(u64::try_from(e.create_rev).unwrap_or(0)),
            Verdict::Waits(target) => Next::Waits(Some(target), ahead),
            Verdict::Unclear => Next::Waits(None, ahead),
        })
    }

    async fn hold(&mut self) -> Result<bool> {
        let (s, e, lease) = (self.shared, &mut *self.e, self.lease);
        let rev = e.create_rev;
        if !s.on_holder_session(e, rev, lease).await? {
            return Ok(false);
        }
        // The server keeps the key at least until the last confirmed keep-alive plus the TTL;
        // make sure that covers the lease the registry counts from `sent`.
        let Some(attached) = e.attached.clone() else {
            return Err(Error::backend(KIND, "internal: no session for the key"));
        };
        if attached.confirmed() + attached.ttl < self.sent + lease
            && !attached.keep_alive_now(s.opts.request_timeout).await?
        {
            s.session_died(&attached);
            e.requeue();
            return Ok(false);
        }
        let deadline = self.sent + lease;
        e.hold(deadline);
        if let Some(w) = self.slot.take_watch() {
            s.watches.cancel(w);
        }
        s.slots.reap_by(self.token, deadline);
        Ok(true)
    }

    async fn leave(&mut self) -> Result<()> {
        let unused = !self.slot.subscribed();
        let (s, e) = (self.shared, &mut *self.e);
        s.delete_and_forget(self.slot, e, self.token, unused).await;
        Ok(())
    }

    async fn refuse(&mut self, other: u32) -> Error {
        let permits = self.kind.max_holders();
        let (s, e) = (self.shared, &mut *self.e);
        s.delete_and_forget(self.slot, e, self.token, false).await;
        Error::config(format!(
            "semaphore {} has holders with {other} permits; this one asks for {permits}",
            crate::ShortKey(e.dir.trim_end_matches('/'))
        ))
    }

    async fn wait(&mut self, pred: Option<WatchTarget>, ahead: Option<u32>) -> Result<bool> {
        let (s, slot, e) = (self.shared, self.slot, &mut *self.e);
        e.stage = Stage::Queued;
        e.pred = pred.clone();
        e.seen = (ahead, slot.signal.generation());
        let Some(pred) = pred else {
            return Ok(false);
        };
        if !slot.subscribed() || slot.watches(&pred) {
            // The watch on the predecessor wakes this waiter in turn.
            return Ok(true);
        }
        if ahead.is_some_and(|a| a >= FAR_BACK) {
            // Far back, the predecessor goes only after many hand-overs: watch it from just
            // after the read that found it, so that a change since then fires too, and spare
            // the second read (each ranges the whole directory on the server). A watch from an
            // older revision than the server's is caught up only every 100 ms (etcd's unsynced
            // watchers), too late for a predecessor that goes soon.
            s.watch_pred(slot, pred, self.at).await?;
            return Ok(true);
        }
        // Watch the predecessor from now on, then look again: if it went before the watch
        // started, the next read shows it.
        s.watch_pred(slot, pred, 0).await?;
        Ok(false)
    }

    fn unsettled(&self) -> Result<Attempt> {
        Ok(Attempt::BUSY)
    }
}
