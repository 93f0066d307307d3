//! Renewals and the reaper: keep-alives of the sessions in use, checks that the own keys still
//! exist, and the background task that deletes keys whose lease ran out or whose waiter left.

use super::options::{CHECK_CHUNK, DELETE_RETRY, KIND, ORPHAN_GRACE, WAITER_IDLE};
use super::queue::class_of;
use super::state::{Phase, Shared, Slot};
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
                let exists = match &check {
                    Ok(resp) => Ok(pb::range_at(resp, j).is_some_and(|g| {
                        g.kvs.first().is_some_and(|kv| {
                            kv.key == key.as_bytes() && kv.create_revision == *rev
                        })
                    })),
                    Err(err) => Err(err.to_string()),
                };
                let alive = ka_of.get(&s.id).map_or(Ok(false), |r| match r {
                    Ok(b) => Ok(*b),
                    Err(e) => Err(e.to_string()),
                });
                let result = match (exists, alive) {
                    (Ok(false), _) | (_, Ok(false)) => {
                        self.key_lost(slot, *rev).await;
                        Ok(false)
                    }
                    (Ok(true), Ok(true)) => {
                        let mut e = slot.entry.lock().await;
                        if e.phase == Phase::Held && e.create_rev == *rev {
                            e.deadline = Some(sent + batch[*i].lease);
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

    /// A renewal found the key gone: nothing is left on the server for this token.
    pub(super) async fn key_lost(&self, slot: &Arc<Slot>, rev: i64) {
        let mut e = slot.entry.lock().await;
        if e.phase == Phase::Held && e.create_rev == rev {
            tracing::debug!(key = %e.key, "lock key gone or its lease expired");
            // The key may still exist if only the session was found dead: delete to be sure.
            e.phase = Phase::Zombie;
            e.retry_at = Some(Instant::now());
            self.reap_at(Instant::now());
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
                self.key_lost(&slot, rev).await;
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
            self.key_lost(&slot, rev).await;
            return Ok(false);
        }
        let mut e = slot.entry.lock().await;
        if e.phase == Phase::Held && e.create_rev == rev {
            e.deadline = Some(sent + lease);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// One pass of the reaper: deletes keys whose holder stopped renewing, keys whose waiter
    /// vanished and keys an earlier deletion failed to remove. Returns when to look again.
    pub(super) async fn reap(&self) -> Instant {
        let now = Instant::now();
        let mut next = now + Duration::from_secs(5);
        let slots: Vec<(Token, Arc<Slot>)> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(t, s)| (*t, s.clone()))
            .collect();
        for (token, slot) in slots {
            let Ok(mut e) = slot.entry.try_lock() else {
                next = next.min(now + Duration::from_millis(200));
                continue;
            };
            let idle_since = e.touched.map(|t| t + WAITER_IDLE);
            // The last attempt failed and nothing happened since: the registry may have given
            // up on a key it does not know about.
            let orphan_at = e
                .failed_at
                .filter(|f| e.touched.is_none_or(|t| t <= *f))
                .map(|f| f + ORPHAN_GRACE);
            let on_server = matches!(e.phase, Phase::Queued) || e.maybe_created;
            if on_server && !slot.subscribed() {
                if let Some(t) = orphan_at.filter(|t| *t > now) {
                    next = next.min(t);
                }
            }
            let orphaned = on_server
                && e.phase != Phase::Held
                && !slot.subscribed()
                && orphan_at.is_some_and(|t| t <= now);
            let delete = orphaned
                || match e.phase {
                    Phase::Held => match e.deadline {
                        Some(d) if d <= now => {
                            tracing::debug!(key = %e.key, "lease ended without renewal; deleting the lock key");
                            true
                        }
                        Some(d) => {
                            next = next.min(d);
                            false
                        }
                        None => false,
                    },
                    Phase::Queued if !slot.subscribed() => match idle_since {
                        Some(t) if t <= now => true,
                        Some(t) => {
                            next = next.min(t);
                            false
                        }
                        None => true,
                    },
                    Phase::Zombie => match e.retry_at {
                        Some(t) if t > now => {
                            next = next.min(t);
                            false
                        }
                        _ => true,
                    },
                    Phase::New if e.maybe_created && idle_since.is_none_or(|t| t <= now) => true,
                    Phase::New | Phase::Done if !slot.subscribed() => {
                        if idle_since.is_none_or(|t| t <= now) {
                            self.drop_slot(token, &slot);
                        } else if let Some(t) = idle_since {
                            next = next.min(t);
                        }
                        false
                    }
                    _ => false,
                };
            if delete {
                if let Some(w) = slot.take_watch() {
                    self.watches.cancel(w);
                }
                match self.delete_own(&e, token).await {
                    Ok(_) => {
                        e.phase = Phase::Done;
                        self.forget_key(&mut e, token);
                        self.drop_slot(token, &slot);
                    }
                    Err(err) => {
                        self.zombify(&mut e, err);
                        next = next.min(now + DELETE_RETRY);
                    }
                }
            }
        }
        next
    }
}

impl Reap for Shared {
    type Key = ();

    fn reaper(&self) -> &Reaper<()> {
        &self.reaper
    }

    /// A pass over every slot; the next one is due when the pass says.
    async fn due(self: &Arc<Self>, _: ()) -> Option<Instant> {
        Some(self.reap().await)
    }
}
