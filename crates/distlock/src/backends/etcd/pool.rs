//! The session pool: which session lease a key is attached to, granting new ones, and what
//! happens when one dies. The keep-alive of each session is in `session.rs`.

use crate::backend::Token;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::backends::contenders::Locked;
use crate::error::{Error, Result};

use super::options::{KIND, SESSION_IDLE};
use super::rpc_error::map_err;
use super::session::{run_keeper, Session, SessionPool};
use super::state::Shared;

/// The TTL (whole seconds, at least one) of the waiters' session.
pub(super) fn waiter_class(ttl: Duration) -> i64 {
    ttl.as_secs_f64().ceil().clamp(1.0, 9e9) as i64
}

impl Shared {
    /// Picks (or grants) a session of TTL class `class` (whole seconds) whose id no other
    /// token of this instance uses for `dir`, and registers `token` as its user for `dir`.
    pub(super) async fn session_of_class(
        &self,
        dir: &str,
        token: Token,
        class: i64,
    ) -> Result<Arc<Session>> {
        if let Some(s) = self.pick_session(dir, token, class) {
            return Ok(s);
        }
        let _granting = self.granting.lock().await;
        if let Some(s) = self.pick_session(dir, token, class) {
            return Ok(s);
        }
        let s = self.grant(class).await?;
        s.users.locked().insert(dir.to_owned(), token);
        self.pool.locked().push(s.clone());
        Ok(s)
    }

    pub(super) fn pick_session(&self, dir: &str, token: Token, class: i64) -> Option<Arc<Session>> {
        let pool = self.pool.locked();
        for s in pool.iter() {
            if s.class != class || s.is_dead() {
                continue;
            }
            let mut users = s.users.locked();
            if users.contains_key(dir) {
                continue;
            }
            users.insert(dir.to_owned(), token);
            return Some(s.clone());
        }
        None
    }

    /// A session of at least `class` seconds for keys that outgrew theirs (no user entry).
    pub(super) async fn session_at_least(&self, class: i64) -> Result<Arc<Session>> {
        {
            let pool = self.pool.locked();
            if let Some(s) = pool.iter().find(|s| s.class >= class && !s.is_dead()) {
                s.attached.fetch_add(1, Ordering::AcqRel);
                return Ok(s.clone());
            }
        }
        let _granting = self.granting.lock().await;
        let s = self.grant(class).await?;
        s.attached.fetch_add(1, Ordering::AcqRel);
        self.pool.locked().push(s.clone());
        Ok(s)
    }

    pub(super) async fn grant(&self, class: i64) -> Result<Arc<Session>> {
        let sent = Instant::now();
        let resp = self.client.lease_grant(class).await.map_err(map_err)?;
        if !resp.error.is_empty() || resp.ttl <= 0 {
            return Err(Error::backend(
                KIND,
                format!("lease grant failed: {}", resp.error),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let s = Arc::new(Session {
            id: resp.id,
            class,
            ttl: Duration::from_secs(u64::try_from(resp.ttl).unwrap_or(1)),
            dead: AtomicBool::new(false),
            users: Mutex::new(HashMap::new()),
            attached: AtomicUsize::new(0),
            idle_since: Mutex::new(None),
            confirmed: Mutex::new(sent),
            cmds: tx,
        });
        tracing::debug!(lease = %format!("{:x}", s.id), ttl = ?s.ttl, "etcd session lease granted");
        tokio::spawn(run_keeper(
            self.client.clone(),
            s.clone(),
            self.me.clone() as Weak<dyn SessionPool>,
            rx,
            self.opts.request_timeout,
        ));
        Ok(s)
    }

    /// A session's lease is gone (expired, revoked): forget it and wake its users, whose keys
    /// went with it.
    pub(super) fn session_died(&self, s: &Arc<Session>) {
        s.dead.store(true, Ordering::Release);
        self.pool.locked().retain(|p| !Arc::ptr_eq(p, s));
        let tokens: Vec<Token> = s.users.locked().values().copied().collect();
        tracing::debug!(lease = %format!("{:x}", s.id), keys = tokens.len(), "etcd session lease gone");
        for t in tokens {
            if let Some(slot) = self.slots.get(t) {
                slot.signal.fire();
            }
        }
    }
}

impl SessionPool for Shared {
    fn retire_if_idle(&self, session: &Arc<Session>) -> bool {
        let mut pool = self.pool.locked();
        if !session.is_idle_for(SESSION_IDLE) {
            return false;
        }
        pool.retain(|p| !Arc::ptr_eq(p, session));
        session.dead.store(true, Ordering::Release);
        true
    }

    fn session_died(&self, session: &Arc<Session>) {
        Shared::session_died(self, session);
    }
}
