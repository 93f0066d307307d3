//! Renewals and the reaper: keep-alives of the sessions in use, checks that the own keys still
//! exist, and the reaper's look at one token's slot (on the family's one task per backend),
//! which deletes a key whose lease ran out or whose waiter left.

use super::options::{CHECK_CHUNK, KIND};
use super::queue::class_of;
use super::state::{Shared, Slot, RULES};
use crate::backend::{Renewal, Token};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::backends::contenders::reaper::Reap;
use crate::backends::contenders::{Fate, Stage};
use tokio::time::Instant;

use crate::error::{Error, Result};

use super::pb;
use super::session::Session;

/// A held key for a renewal: its slot, key, create revision and the session it is attached to.
type Held = (Arc<Slot>, String, i64, Arc<Session>);

/// When the reaper looks again at a slot it found in use.
const BUSY_AGAIN: Duration = Duration::from_millis(200);

impl Shared {
    /// Renews the holds of `batch` (all of this instance): a key whose new lease outlives its
    /// session moves to a longer one first (see [`held`](Self::held)); then one
    /// keep-alive per session and one read-only transaction per chunk of keys, all at once. A
    /// batch of one checks its key's create revision in a compare, and answers an error of
    /// either request before what the other found.
    pub(super) async fn extend_batch(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        let sent = Instant::now();
        let one = batch.len() == 1;
        let mut out: Vec<Option<Result<bool>>> = (0..batch.len()).map(|_| None).collect();
        // (index, slot, key, create revision, session)
        let mut live = Vec::new();
        for (i, r) in batch.iter().enumerate() {
            match self.held(r.token, r.lease).await {
                Ok(Some((slot, key, rev, a))) => live.push((i, slot, key, rev, a)),
                Ok(None) => out[i] = Some(Ok(false)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let mut sessions: Vec<Arc<Session>> = Vec::new();
        let mut seen = HashSet::new();
        for (_, _, _, _, s) in &live {
            if seen.insert(s.id) {
                sessions.push(s.clone());
            }
        }
        let timeout = self.opts.request_timeout;
        let kas =
            futures_util::future::join_all(sessions.iter().map(|s| s.keep_alive_now(timeout)));
        let checks = futures_util::future::join_all(live.chunks(CHECK_CHUNK).map(|chunk| {
            if one {
                let (_, _, key, rev, _) = &chunk[0];
                let same = pb::create_revision_is(key.as_bytes(), *rev);
                return self.txn(pb::txn(vec![same], vec![], vec![]));
            }
            let ops: Vec<pb::RequestOp> = chunk
                .iter()
                .map(|(_, _, key, _, _)| {
                    pb::op_range(pb::RangeRequest {
                        keys_only: true,
                        ..pb::range_key(key.as_bytes())
                    })
                })
                .collect();
            self.txn(pb::txn(vec![], ops, vec![]))
        }));
        let (mut kas, checks) = futures_util::future::join(kas, checks).await;
        let shared = |r: &Result<bool>| r.as_ref().copied().map_err(Error::to_string);
        let ka_of: HashMap<i64, std::result::Result<bool, String>> = sessions
            .iter()
            .map(|s| s.id)
            .zip(kas.iter().map(shared))
            .collect();
        for (chunk, check) in live.chunks(CHECK_CHUNK).zip(checks) {
            if one {
                let (i, slot, _, rev, _) = &chunk[0];
                out[*i] = Some(match (kas.remove(0), check) {
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    (Ok(alive), Ok(check)) => Ok(self
                        .confirmed(
                            slot,
                            batch[*i].token,
                            *rev,
                            sent + batch[*i].lease,
                            alive && check.succeeded,
                        )
                        .await),
                });
                continue;
            }
            for (j, (i, slot, key, rev, s)) in chunk.iter().enumerate() {
                let exists = check.as_ref().map_err(Error::to_string).map(|resp| {
                    let kv = pb::range_at(resp, j).and_then(|g| g.kvs.first());
                    kv.is_some_and(|kv| kv.key == key.as_bytes() && kv.create_revision == *rev)
                });
                let alive = ka_of.get(&s.id).cloned().unwrap_or(Ok(false));
                let (token, deadline) = (batch[*i].token, sent + batch[*i].lease);
                out[*i] = Some(match (exists, alive) {
                    (Ok(false), _) | (_, Ok(false)) => {
                        Ok(self.confirmed(slot, token, *rev, deadline, false).await)
                    }
                    (Ok(true), Ok(true)) => {
                        self.confirmed(slot, token, *rev, deadline, true).await;
                        Ok(true)
                    }
                    (Err(m), _) | (_, Err(m)) => Err(Error::unavailable(KIND, m)),
                });
            }
        }
        for s in &sessions {
            if matches!(ka_of.get(&s.id), Some(Ok(false))) {
                self.session_died(s);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::backend(KIND, "renewal not answered"))))
            .collect()
    }
    /// The held key of `token` for a renewal with `lease`, and the session it is attached to:
    /// a longer one when `lease` outlives its own (the key is put again with it, which keeps its
    /// name, create revision and place). `None` when it is not held, or was lost on the way.
    async fn held(&self, token: Token, lease: Duration) -> Result<Option<Held>> {
        let Some(slot) = self.slots.get(token) else {
            return Ok(None);
        };
        let (key, value, rev, attached, owned) = {
            let e = slot.entry.lock().await;
            match (e.stage, e.attached.clone()) {
                (Stage::Held, Some(a)) => {
                    let owned = e.owned(e.key.as_bytes());
                    (e.key.clone(), e.value.clone(), e.create_rev, a, owned)
                }
                _ => return Ok(None),
            }
        };
        let class = class_of(lease, self.opts.min_session_ttl);
        if class <= attached.class {
            return Ok(Some((slot, key, rev, attached)));
        }
        let longer = self.session_at_least(class).await?;
        let put = vec![pb::op_put(key.as_bytes(), &value, longer.id)];
        let ok = match self.txn(pb::txn(owned, put, vec![])).await {
            Ok(r) => r.succeeded,
            Err(err) => {
                longer.attached.fetch_sub(1, Ordering::AcqRel);
                return Err(err);
            }
        };
        let mut e = slot.entry.lock().await;
        if !ok || e.stage != Stage::Held || e.create_rev != rev {
            longer.attached.fetch_sub(1, Ordering::AcqRel);
            drop(e);
            self.confirmed(&slot, token, rev, Instant::now(), false)
                .await;
            return Ok(None);
        }
        if let Some(old) = e.attached.replace(longer.clone()) {
            if e.session.as_ref().is_some_and(|n| !Arc::ptr_eq(n, &old)) {
                old.attached.fetch_sub(1, Ordering::AcqRel);
            }
        }
        drop(e);
        Ok(Some((slot, key, rev, longer)))
    }

    /// What a renewal found of `token`'s hold created at `rev`: its session and key there
    /// (`ok`), and then the hold lasts until `deadline` (the reaper looks then at the latest: a
    /// renewal with a shorter lease may end it before the instant planned), or not. Whether
    /// the hold is still this one.
    async fn confirmed(
        &self,
        slot: &Arc<Slot>,
        token: Token,
        rev: i64,
        deadline: Instant,
        ok: bool,
    ) -> bool {
        let mut e = slot.entry.lock().await;
        if e.stage != Stage::Held || e.create_rev != rev {
            return false;
        }
        if ok {
            e.deadline = Some(deadline);
            self.slots.reap_by(token, deadline);
        } else {
            // The key may still exist if only the session was found dead: delete to be sure.
            let err = Error::unavailable(KIND, "lock key gone or its lease expired");
            self.zombify(slot, &mut e, token, err);
        }
        ok
    }
}

impl Reap for Shared {
    type Key = Token;

    /// The reaper's look at `token`'s slot: deletes its key when its holder stopped renewing,
    /// its waiter vanished or its last attempt failed and nobody came back, and forgets an idle
    /// slot. Returns when to look again; nothing while its waiter is subscribed (dropping the
    /// subscription plans a look) or a failed deletion is retried (`zombify`).
    async fn due(self: &Arc<Self>, token: Token) -> Option<Instant> {
        let slot = self.slots.get(token)?;
        let now = Instant::now();
        let Ok(mut e) = slot.entry.try_lock() else {
            // An attempt or release is under way; it plans the slot again when it ends.
            return Some(now + BUSY_AGAIN);
        };
        match e.fate(&RULES, slot.subscribed(), now) {
            Fate::Keep(next) => return next,
            Fate::Forget => {
                self.slots.forget_if(token, |s| Arc::ptr_eq(s, &slot));
                return None;
            }
            Fate::Delete => {}
        }
        if e.stage == Stage::Held {
            tracing::debug!(key = %e.key, "lease ended without renewal; deleting the lock key");
        }
        if let Some(w) = slot.take_watch() {
            self.watches.cancel(w);
        }
        self.delete_and_forget(&slot, &mut e, token, true).await;
        None
    }
}
