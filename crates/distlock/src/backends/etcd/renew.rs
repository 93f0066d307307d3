//! Renewals and the reaper: keep-alives of the sessions in use, checks that the own keys still
//! exist, and the reaper's look at one token's slot (on the family's one task per backend),
//! which deletes a key whose lease ran out or whose waiter left.

use super::options::{CHECK_CHUNK, KIND};
use super::queue::class_of;
use super::state::{Entry, Fate, Phase, Shared, Slot};
use crate::backend::{Renewal, Token};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::backends::contenders::reaper::{Reap, Reaper};
use tokio::time::Instant;

use crate::error::{Error, Result};

use super::pb;
use super::session::Session;

/// When the reaper looks again at a slot it found in use.
const BUSY_AGAIN: Duration = Duration::from_millis(200);

impl Shared {
    /// Renews the holds of `batch` (all of this instance): one keep-alive per session and one
    /// read-only transaction per chunk of keys, all at once.
    pub(super) async fn extend_batch(&self, batch: &[Renewal]) -> Vec<Result<bool>> {
        let sent = Instant::now();
        let mut out: Vec<Option<Result<bool>>> = (0..batch.len()).map(|_| None).collect();
        // (index, slot, key, create revision, session)
        let mut live = Vec::new();
        let mut longer = Vec::new();
        for (i, r) in batch.iter().enumerate() {
            let Some(slot) = self.slot(r.token) else {
                out[i] = Some(Ok(false));
                continue;
            };
            let e = slot.entry.lock().await;
            match (e.phase, e.attached.clone()) {
                (Phase::Held, Some(a)) => {
                    if class_of(r.lease, self.opts.min_session_ttl) > a.class {
                        longer.push(i);
                    } else {
                        live.push((i, slot.clone(), e.key.clone(), e.create_rev, a));
                    }
                }
                _ => out[i] = Some(Ok(false)),
            }
        }
        for i in longer {
            out[i] = Some(self.extend_one(batch[i].token, batch[i].lease).await);
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
        let (kas, checks) = futures_util::future::join(kas, checks).await;
        let ka_of: HashMap<i64, &Result<bool>> =
            sessions.iter().map(|s| s.id).zip(kas.iter()).collect();
        for (chunk, check) in live.chunks(CHECK_CHUNK).zip(checks) {
            for (j, (i, slot, key, rev, s)) in chunk.iter().enumerate() {
                let exists = check.as_ref().map_err(Error::to_string).map(|resp| {
                    let kv = pb::range_at(resp, j).and_then(|g| g.kvs.first());
                    kv.is_some_and(|kv| kv.key == key.as_bytes() && kv.create_revision == *rev)
                });
                let alive = ka_of
                    .get(&s.id)
                    .map_or(Ok(false), |r| r.as_ref().copied().map_err(Error::to_string));
                let result = match (exists, alive) {
                    (Ok(false), _) | (_, Ok(false)) => {
                        self.key_lost(slot, batch[*i].token, *rev).await;
                        Ok(false)
                    }
                    (Ok(true), Ok(true)) => {
                        let mut e = slot.entry.lock().await;
                        if e.phase == Phase::Held && e.create_rev == *rev {
                            self.renewed(&mut e, batch[*i].token, sent + batch[*i].lease);
                        }
                        Ok(true)
                    }
                    (Err(m), _) | (_, Err(m)) => Err(Error::unavailable(KIND, m)),
                };
                out[*i] = Some(result);
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

    /// A renewal confirmed the hold until `deadline`. The reaper looks then at the latest: a
    /// renewal with a shorter lease may end it before the instant planned.
    fn renewed(&self, e: &mut Entry, token: Token, deadline: Instant) {
        e.deadline = Some(deadline);
        self.reap_at(token, deadline);
    }

    /// A renewal found the key gone: nothing is left on the server for this token.
    pub(super) async fn key_lost(&self, slot: &Arc<Slot>, token: Token, rev: i64) {
        let mut e = slot.entry.lock().await;
        if e.phase == Phase::Held && e.create_rev == rev {
            // The key may still exist if only the session was found dead: delete to be sure.
            let err = Error::unavailable(KIND, "lock key gone or its lease expired");
            self.zombify(slot, &mut e, token, err);
        }
    }

    pub(super) async fn extend_one(&self, token: Token, lease: Duration) -> Result<bool> {
        let Some(slot) = self.slot(token) else {
            return Ok(false);
        };
        let sent = Instant::now();
        let (key, value, rev, mut attached, owned) = {
            let e = slot.entry.lock().await;
            match (e.phase, e.attached.clone()) {
                (Phase::Held, Some(a)) => (
                    e.key.clone(),
                    e.value.clone(),
                    e.create_rev,
                    a,
                    e.owned(e.key.as_bytes()),
                ),
                _ => return Ok(false),
            }
        };
        let class = class_of(lease, self.opts.min_session_ttl);
        if class > attached.class {
            // The new lease outlives the session: attach the key to a longer one (its name,
            // create revision and place stay the same).
            let longer = self.session_at_least(class).await?;
            let txn = pb::txn(
                owned,
                vec![pb::op_put(key.as_bytes(), &value, longer.id)],
                vec![],
            );
            let ok = match self.txn(txn).await {
                Ok(r) => r.succeeded,
                Err(err) => {
                    longer.attached.fetch_sub(1, Ordering::AcqRel);
                    return Err(err);
                }
            };
            let mut e = slot.entry.lock().await;
            if !ok || e.phase != Phase::Held || e.create_rev != rev {
                longer.attached.fetch_sub(1, Ordering::AcqRel);
                drop(e);
                self.key_lost(&slot, token, rev).await;
                return Ok(false);
            }
            if let Some(old) = e.attached.replace(longer.clone()) {
                if e.session.as_ref().is_some_and(|n| !Arc::ptr_eq(n, &old)) {
                    old.attached.fetch_sub(1, Ordering::AcqRel);
                }
            }
            attached = longer;
        }
        let check = pb::txn(
            vec![pb::create_revision_is(key.as_bytes(), rev)],
            vec![],
            vec![],
        );
        let (alive, exists) = futures_util::future::join(
            attached.keep_alive_now(self.opts.request_timeout),
            self.txn(check),
        )
        .await;
        let (alive, exists) = (alive?, exists?.succeeded);
        if !alive {
            self.session_died(&attached);
        }
        if !alive || !exists {
            self.key_lost(&slot, token, rev).await;
            return Ok(false);
        }
        let mut e = slot.entry.lock().await;
        if e.phase == Phase::Held && e.create_rev == rev {
            self.renewed(&mut e, token, sent + lease);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// The reaper's look at `token`'s slot: deletes its key when its holder stopped renewing,
    /// its waiter vanished or its last attempt failed and nobody came back, and forgets an idle
    /// slot. Returns when to look again; nothing while its waiter is subscribed (dropping the
    /// subscription plans a look) or a failed deletion is retried (`zombify`).
    async fn look_at(&self, token: Token) -> Option<Instant> {
        let slot = self.slot(token)?;
        let now = Instant::now();
        let Ok(mut e) = slot.entry.try_lock() else {
            // An attempt or release is under way; it plans the slot again when it ends.
            return Some(now + BUSY_AGAIN);
        };
        match e.fate(slot.subscribed(), now) {
            Fate::Keep(next) => return next,
            Fate::Forget => {
                self.drop_slot(token, &slot);
                return None;
            }
            Fate::Delete => {}
        }
        if e.phase == Phase::Held {
            tracing::debug!(key = %e.key, "lease ended without renewal; deleting the lock key");
        }
        if let Some(w) = slot.take_watch() {
            self.watches.cancel(w);
        }
        self.delete_and_forget(&slot, &mut e, token, true).await;
        None
    }
}

impl Reap for Shared {
    type Key = Token;

    fn reaper(&self) -> &Reaper<Token> {
        self.slots.reaper()
    }

    async fn due(self: &Arc<Self>, token: Token) -> Option<Instant> {
        self.look_at(token).await
    }
}
