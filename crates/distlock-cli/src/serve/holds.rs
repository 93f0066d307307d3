//! Holds taken over HTTP: each is a lease its caller owns.
//!
//! The service's registry does not renew (`with_renew(false)`): the backend lease of a hold is
//! exactly the caller's lease, set at acquisition and reset by each `PUT`. A caller that neither
//! extends nor releases therefore loses the hold when its lease ends, on the server as well as
//! here, even while the service stays up (and even if the service dies). Each hold has its own
//! remote acquisition (`with_max_local_handoffs(0)`), so its lease and token are its own.
//!
//! The token a caller gets is made here, not the backend's owner token: it only names the hold
//! in this service and means nothing to the backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, LockGuard, LockRegistry, Token};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::events::{millis, Board};
use super::ApiError;

/// Lease of a hold when the request names none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Longest wait a request may ask for: an HTTP request should not stay open for longer.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The body of `POST /v1/locks/{key}`; every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    pub lease_ms: Option<u64>,
    /// Absent: one attempt; else how long to wait for the lock.
    pub wait_ms: Option<u64>,
    #[serde(default)]
    pub shared: bool,
    pub permits: Option<u32>,
}

/// The body of `PUT /v1/locks/{key}/{token}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    pub lease_ms: Option<u64>,
}

/// The kind of lock a request asks for. Only exclusive locks exist in the library so far;
/// the others are refused until they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    Exclusive,
}

impl LockKind {
    fn of(req: &AcquireRequest) -> Result<Self, ApiError> {
        if req.shared {
            return Err(ApiError::bad_request("shared locks are not supported yet"));
        }
        if req.permits.is_some() {
            return Err(ApiError::bad_request(
                "semaphores (permits) are not supported yet",
            ));
        }
        Ok(LockKind::Exclusive)
    }

    /// The name in JSON and on the page.
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Exclusive => "exclusive",
        }
    }
}

/// What `POST` answers on success.
#[derive(Debug, serde::Serialize)]
pub struct Granted {
    pub key: String,
    pub token: String,
    pub fence: u64,
    pub lease_ms: u64,
}

/// One hold taken over HTTP.
struct HttpHold {
    key: String,
    board_id: u64,
    /// `None` once released or expired (whoever takes it out answers for it).
    guard: tokio::sync::Mutex<Option<LockGuard>>,
    /// The task that ends the hold when its lease runs out.
    expiry: Mutex<Option<AbortHandle>>,
}

/// The holds of this service, by token.
#[derive(Clone)]
pub struct Holds {
    registry: LockRegistry,
    board: Board,
    table: Arc<Mutex<HashMap<String, Arc<HttpHold>>>>,
    /// Turns true at shutdown: waiting requests stop, new ones are refused.
    stopping: watch::Receiver<bool>,
}

fn lease_of(ms: Option<u64>) -> Result<Duration, ApiError> {
    let lease = ms.map_or(DEFAULT_LEASE, Duration::from_millis);
    if lease < distlock::MIN_LEASE || lease > distlock::MAX_LEASE {
        return Err(ApiError::bad_request(format!(
            "lease_ms must be {} to {}",
            millis(distlock::MIN_LEASE),
            millis(distlock::MAX_LEASE)
        )));
    }
    Ok(lease)
}

impl Holds {
    /// Holds over `registry`, which must not renew (see the module docs).
    pub fn new(registry: LockRegistry, board: Board, stopping: watch::Receiver<bool>) -> Self {
        Holds {
            registry,
            board,
            table: Arc::new(Mutex::new(HashMap::new())),
            stopping,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<HttpHold>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The registry the holds are taken through.
    pub fn registry(&self) -> &LockRegistry {
        &self.registry
    }

    /// How many holds are open.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// `POST /v1/locks/{key}`: one attempt, or waits up to `wait_ms`.
    ///
    /// # Cancel safety
    /// Cancel safe (a caller that hangs up drops it): the library's `try_lock_for` leaves nothing
    /// held when dropped, and a hold is only entered in the table after it was acquired.
    pub async fn acquire(&self, key: &str, req: AcquireRequest) -> Result<Granted, ApiError> {
        let _kind = LockKind::of(&req)?;
        let lease = lease_of(req.lease_ms)?;
        let wait = req.wait_ms.map(Duration::from_millis);
        if wait.is_some_and(|w| w > MAX_WAIT) {
            return Err(ApiError::bad_request(format!(
                "wait_ms must be at most {}",
                millis(MAX_WAIT)
            )));
        }
        let lock = self.registry.obtain(key)?.with_lease(lease)?;
        let mut stopping = self.stopping.clone();
        if *stopping.borrow() {
            return Err(ApiError::shutting_down());
        }
        let guard = match wait {
            None | Some(Duration::ZERO) => match lock.try_lock().await {
                Err(Error::NotAcquired { .. }) => {
                    return Err(ApiError::conflict(format!("lock {key:?} is held")))
                }
                got => got?,
            },
            Some(wait) => {
                let _ticket = self.board.waiting(key, "http");
                tokio::select! {
                    biased;
                    _ = stopping.wait_for(|s| *s) => return Err(ApiError::shutting_down()),
                    got = lock.try_lock_for(wait) => got?,
                }
            }
        };
        let token = Token::random().to_string();
        let fence = guard.fence();
        let board_id = self.board.acquired(key, "http", fence, lease);
        let lost = guard.lost();
        let hold = Arc::new(HttpHold {
            key: key.to_owned(),
            board_id,
            guard: tokio::sync::Mutex::new(Some(guard)),
            expiry: Mutex::new(None),
        });
        self.table().insert(token.clone(), hold.clone());
        let this = self.clone();
        let expiring_token = token.clone();
        let expiry = tokio::spawn(async move {
            lost.await;
            this.expire(&expiring_token).await;
        });
        *hold.expiry.lock().unwrap_or_else(|e| e.into_inner()) = Some(expiry.abort_handle());
        // Shutdown releases the holds in the table once it is stopping; one entered after that
        // (acquired while shutdown began) is given back here, so none outlives the service.
        if *self.stopping.borrow() {
            let _ = self.release(key, &token).await;
            return Err(ApiError::shutting_down());
        }
        Ok(Granted {
            key: key.to_owned(),
            token,
            fence,
            lease_ms: millis(lease),
        })
    }

    /// The hold of `token` if it is one of `key`'s.
    fn find(&self, key: &str, token: &str) -> Option<Arc<HttpHold>> {
        self.table().get(token).filter(|h| h.key == key).cloned()
    }

    /// Takes the hold out of the table (once: a second caller gets `None`).
    fn take(&self, token: &str, hold: &Arc<HttpHold>) -> bool {
        let mut table = self.table();
        match table.get(token) {
            Some(h) if Arc::ptr_eq(h, hold) => {
                table.remove(token);
                true
            }
            _ => false,
        }
    }

    /// The hold's lease ran out (or the backend took it away): it ends, and the guard's drop
    /// frees the key on the server if our token is still there.
    async fn expire(&self, token: &str) {
        let Some(hold) = self.table().get(token).cloned() else {
            return;
        };
        let guard = hold.guard.lock().await.take();
        if guard.is_some() && self.take(token, &hold) {
            self.board.ended(
                hold.board_id,
                "lost",
                Some("the caller's lease ended".into()),
            );
        }
    }

    /// `PUT /v1/locks/{key}/{token}`: the lease is `lease_ms` from now. Answers the lease left.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped midway, the extension may or may not have reached the server, and
    /// the hold keeps counting its old lease, which ends no later than the server's.
    pub async fn extend(
        &self,
        key: &str,
        token: &str,
        req: ExtendRequest,
    ) -> Result<Duration, ApiError> {
        let lease = lease_of(req.lease_ms)?;
        let hold = self.find(key, token).ok_or_else(ApiError::gone)?;
        let slot = hold.guard.lock().await;
        let guard = slot.as_ref().ok_or_else(ApiError::gone)?;
        match guard.extend(lease).await {
            Ok(()) => {
                let remaining = guard.remaining();
                self.board.extended(hold.board_id, remaining);
                Ok(remaining)
            }
            Err(Error::LockLost { .. }) => {
                drop(slot);
                self.expire(token).await;
                Err(ApiError::gone())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `DELETE /v1/locks/{key}/{token}`.
    ///
    /// # Cancel safety
    /// Cancel safe: once the hold is out of the table, the release finishes or the lease
    /// ends; the hold is never left half-released in the table.
    pub async fn release(&self, key: &str, token: &str) -> Result<(), ApiError> {
        let hold = self.find(key, token).ok_or_else(ApiError::gone)?;
        let guard = hold.guard.lock().await.take().ok_or_else(ApiError::gone)?;
        self.take(token, &hold);
        if let Some(expiry) = hold.expiry.lock().unwrap_or_else(|e| e.into_inner()).take() {
            expiry.abort();
        }
        match guard.release().await {
            Ok(()) => {
                self.board.ended(hold.board_id, "released", None);
                Ok(())
            }
            Err(Error::LockLost { .. }) => {
                let reason = Some("the caller's lease ended".into());
                self.board.ended(hold.board_id, "lost", reason);
                Err(ApiError::gone())
            }
            Err(e) => {
                // Not renewed, the hold ends with its lease at the latest.
                self.board
                    .ended(hold.board_id, "lost", Some(format!("release failed: {e}")));
                Err(e.into())
            }
        }
    }

    /// Releases every hold (at shutdown). Their tokens are then unknown: a caller's next
    /// request for one answers 410, from this process or from the next one.
    ///
    /// # Cancel safety
    /// Cancel safe: each release is cancel safe, and a hold whose release was cut off ends
    /// with its lease.
    pub async fn release_all(&self) {
        let tokens: Vec<(String, String)> = self
            .table()
            .iter()
            .map(|(t, h)| (t.clone(), h.key.clone()))
            .collect();
        let releases = tokens.iter().map(|(token, key)| self.release(key, token));
        let _ = futures_util::future::join_all(releases).await;
    }
}
