//! Session leases: one etcd lease per lease length (and per extra contender of a key), kept
//! alive by a background task.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::client::{Client, KeepAliveStream, LeaseKeeper};
use super::options::{KIND, SESSION_IDLE};
use super::pb::LeaseKeepAliveResponse;
use super::rpc_error::{is_lease_not_found, map_err};
use crate::backend::Token;
use crate::backends::contenders::Locked;
use crate::error::{Error, Result};

/// What a session's keeper tells the pool it belongs to.
pub(super) trait SessionPool: Send + Sync {
    /// Takes `session` out of the pool if nobody has used it for [`SESSION_IDLE`]; whether
    /// it did (the keeper then ends it).
    fn retire_if_idle(&self, session: &Arc<Session>) -> bool;
    /// `session`'s lease is gone (expired, revoked).
    fn session_died(&self, session: &Arc<Session>);
}

/// One etcd lease shared by the keys of this backend instance.
pub(super) struct Session {
    pub(super) id: i64,
    /// The TTL asked for, in seconds: sessions are chosen by it.
    pub(super) class: i64,
    /// The TTL the server granted.
    pub(super) ttl: Duration,
    pub(super) dead: AtomicBool,
    /// Lock directories whose key name carries this lease id, and the token that uses each.
    pub(super) users: Mutex<HashMap<String, Token>>,
    /// Keys named after another session but attached to this one (after a longer extension).
    pub(super) attached: AtomicUsize,
    pub(super) idle_since: Mutex<Option<Instant>>,
    /// When the last keep-alive the server confirmed was sent.
    pub(super) confirmed: Mutex<Instant>,
    pub(super) cmds: mpsc::UnboundedSender<KaCmd>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Session({:x}, ttl {:?})", self.id, self.ttl)
    }
}

pub(super) enum KaCmd {
    /// Send a keep-alive now; answer whether the lease is alive.
    Now(oneshot::Sender<Result<bool>>),
    /// Revoke the lease and stop.
    Close,
}

impl Session {
    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    pub(super) fn confirmed(&self) -> Instant {
        *self.confirmed.locked()
    }

    pub(super) fn confirm(&self, sent: Instant) {
        let mut c = self.confirmed.locked();
        if sent > *c {
            *c = sent;
        }
    }

    /// A keep-alive sent after this call: `Ok(true)` when the server confirmed the lease.
    pub(super) async fn keep_alive_now(&self, timeout: Duration) -> Result<bool> {
        if self.is_dead() {
            return Ok(false);
        }
        let (tx, rx) = oneshot::channel();
        if self.cmds.send(KaCmd::Now(tx)).is_err() {
            return Ok(false);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Ok(!self.is_dead()),
            Err(_) => Err(Error::unavailable(KIND, "lease keep-alive timed out")),
        }
    }

    pub(super) fn remove_user(&self, dir: &str, token: Token) {
        let mut users = self.users.locked();
        if users.get(dir) == Some(&token) {
            users.remove(dir);
        }
        if users.is_empty() {
            *self.idle_since.locked() = Some(Instant::now());
        }
    }

    pub(super) fn is_idle_for(&self, d: Duration) -> bool {
        self.users.locked().is_empty()
            && self.attached.load(Ordering::Acquire) == 0
            && self.idle_since.locked().is_some_and(|t| t.elapsed() >= d)
    }
}

/// Keeps one session lease alive: a keep-alive every fifth of the TTL and on demand.
pub(super) async fn run_keeper(
    client: Client,
    session: Arc<Session>,
    shared: Weak<dyn SessionPool>,
    mut rx: mpsc::UnboundedReceiver<KaCmd>,
    request_timeout: Duration,
) {
    type Waiters = Vec<oneshot::Sender<Result<bool>>>;
    let period = (session.ttl / 5).max(Duration::from_millis(50));
    let mut conn: Option<(LeaseKeeper, KeepAliveStream)> = None;
    let mut inflight: VecDeque<(Instant, Waiters)> = VecDeque::new();
    let mut waiting: Waiters = Vec::new();
    let mut next_send = Instant::now() + period;
    let mut close = false;

    enum Ev {
        Cmd(Option<KaCmd>),
        Tick,
        Resp(std::result::Result<Option<LeaseKeepAliveResponse>, tonic::Status>),
        Stalled,
    }

    let answer = |waiters: Waiters, r: &Result<bool>| {
        for w in waiters {
            let _ = w.send(match r {
                Ok(b) => Ok(*b),
                Err(e) => Err(Error::unavailable(KIND, e.to_string())),
            });
        }
    };

    // The server no longer knows the lease: the pool forgets it and wakes its users.
    let died = || match shared.upgrade() {
        Some(shared) => shared.session_died(&session),
        None => session.dead.store(true, Ordering::Release),
    };

    loop {
        if session.is_dead() || close {
            break;
        }
        let stalled_at = inflight.front().map(|(t, _)| *t + request_timeout);
        let ev = tokio::select! {
            c = rx.recv() => Ev::Cmd(c),
            _ = tokio::time::sleep_until(next_send) => Ev::Tick,
            r = async {
                match conn.as_mut() {
                    Some((_, stream)) => stream.message().await,
                    None => std::future::pending().await,
                }
            } => Ev::Resp(r),
            _ = async {
                match stalled_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => Ev::Stalled,
        };
        let mut send = false;
        match ev {
            Ev::Cmd(None) | Ev::Cmd(Some(KaCmd::Close)) => {
                close = true;
                continue;
            }
            Ev::Cmd(Some(KaCmd::Now(tx))) => {
                waiting.push(tx);
                while let Ok(c) = rx.try_recv() {
                    match c {
                        KaCmd::Now(tx) => waiting.push(tx),
                        KaCmd::Close => close = true,
                    }
                }
                send = !close;
            }
            Ev::Tick => {
                // Retire a session nobody has used for a while.
                if session.is_idle_for(SESSION_IDLE)
                    && shared.upgrade().is_some_and(|s| s.retire_if_idle(&session))
                {
                    close = true;
                    continue;
                }
                if shared.strong_count() == 0 {
                    close = true;
                    continue;
                }
                send = true;
            }
            Ev::Resp(Ok(Some(resp))) => {
                let (sent, waiters) = inflight.pop_front().unwrap_or((Instant::now(), Vec::new()));
                if resp.ttl > 0 {
                    session.confirm(sent);
                    answer(waiters, &Ok(true));
                } else {
                    answer(waiters, &Ok(false));
                    died();
                }
            }
            Ev::Resp(_) | Ev::Stalled => {
                conn = None;
                for (_, waiters) in inflight.drain(..) {
                    answer(
                        waiters,
                        &Err(Error::unavailable(KIND, "lease keep-alive stream broke")),
                    );
                }
                next_send = next_send.min(Instant::now() + Duration::from_millis(200));
            }
        }
        if !send {
            continue;
        }
        next_send = Instant::now() + period;
        let t0 = Instant::now();
        match conn.as_mut() {
            Some((keeper, _)) => match keeper.keep_alive().await {
                Ok(()) => inflight.push_back((t0, std::mem::take(&mut waiting))),
                Err(e) => {
                    conn = None;
                    answer(std::mem::take(&mut waiting), &Err(map_err(e)));
                    next_send = Instant::now() + Duration::from_millis(200);
                }
            },
            None => match client.lease_keep_alive(session.id).await {
                Ok(c) => {
                    conn = Some(c);
                    session.confirm(t0);
                    answer(std::mem::take(&mut waiting), &Ok(true));
                }
                Err(e) if is_lease_not_found(&e) => {
                    answer(std::mem::take(&mut waiting), &Ok(false));
                    died();
                }
                Err(e) => {
                    answer(std::mem::take(&mut waiting), &Err(map_err(e)));
                    next_send = Instant::now() + Duration::from_millis(200).min(period);
                }
            },
        }
    }
    // Closing (backend dropped, or idle): revoke, which deletes any key still attached.
    let dead = session.is_dead() && !close;
    session.dead.store(true, Ordering::Release);
    for (_, waiters) in inflight.drain(..) {
        answer(waiters, &Ok(false));
    }
    answer(std::mem::take(&mut waiting), &Ok(false));
    while let Ok(KaCmd::Now(tx)) = rx.try_recv() {
        let _ = tx.send(Ok(false));
    }
    drop(conn);
    if !dead {
        let _ = client.lease_revoke(session.id).await;
        tracing::debug!(lease = %format!("{:x}", session.id), "etcd session lease revoked");
    }
}
