//! Holds taken over HTTP: each is a lease its caller owns.
//!
//! The service's registry does not renew (`with_renew(false)`): the backend lease of a hold is
//! exactly the caller's lease, set at acquisition and reset by each `PUT`. A caller that neither
//! extends nor releases therefore loses the hold when its lease ends, on the server as well as
//! here, even while the service stays up (and even if the service dies). Each hold has its own
//! remote acquisition (`with_max_local_handoffs(0)`), so its lease and token are its own.
//!
//! That holds for every kind. A semaphore permit is a remote hold of its own anyway. Readers
//! of one registry may share one remote read hold, but a reader joins another's hold only
//! while that hold has had fewer than `max_local_handoffs` joiners, which is none here: each
//! shared HTTP hold takes a remote read hold of its own, with its own token and lease, so a
//! reader that stops extending loses its hold while other readers extend theirs (the test
//! `a_shared_caller_that_stops_extending_loses_its_hold_while_another_extends` checks it).
//!
//! The token a caller gets is made here, not the backend's owner token: it only names the hold
//! in this service and means nothing to the backend.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, LockGuard, LockRegistry, Owner, Token};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;

use super::events::{millis, Board, Holder, Name};
use super::expiry::{Expiries, Slot, TokenBits};
use super::ApiError;
use crate::run::HoldKind;

/// Lease of a hold when the request names none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Longest wait a request may ask for: an HTTP request should not stay open for longer.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The body of `POST /v1/locks/{key}`; every field is optional.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    pub lease_ms: Option<u64>,
    /// Absent: one attempt; else how long to wait for the lock.
    pub wait_ms: Option<u64>,
    #[serde(default)]
    pub shared: bool,
    pub permits: Option<u32>,
    /// Who holds it, as listings show it; absent: `http <the caller's address>`.
    pub owner: Option<String>,
}

/// The default owner of a connection's holds, `http <the client's address>`: made once per
/// connection.
#[derive(Debug, Clone)]
pub struct Peer(pub Owner);

tokio::task_local! {
    /// The [`Peer`] of the connection whose task serves the request (hyper serves a
    /// connection's requests in the connection's own task); absent outside one.
    pub static PEER: Option<Peer>;
}

impl Peer {
    /// The peer of the connection being served, if any.
    pub fn current() -> Option<Peer> {
        PEER.try_with(Option::clone).ok().flatten()
    }
}

/// The body of `PUT /v1/locks/{key}/{token}`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    pub lease_ms: Option<u64>,
}

/// The kind of hold a request asks for: `shared` is the read side of the key's read-write
/// lock, `permits: N` one permit of the key's semaphore of N, neither the key's mutex (the
/// holds `distlock run` takes with `--shared`, `--permits N` and without either).
fn kind_of(req: &AcquireRequest) -> Result<HoldKind, ApiError> {
    match (req.shared, req.permits) {
        (true, Some(_)) => Err(ApiError::bad_request(
            "shared and permits exclude each other: a hold is shared (a read lock) or a permit of a semaphore",
        )),
        (true, None) => Ok(HoldKind::Shared),
        (false, Some(n)) => {
            distlock::LockKind::semaphore(n)?;
            Ok(HoldKind::Permit(n))
        }
        (false, None) => Ok(HoldKind::Exclusive),
    }
}

/// What `POST` answers on success.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Granted {
    pub key: String,
    pub token: String,
    pub fence: u64,
    pub lease_ms: u64,
}

/// One hold taken over HTTP.
struct HttpHold {
    /// Shared with the board's entry.
    key: Name,
    board_id: u64,
    /// `None` once released or expired (whoever takes it out answers for it).
    guard: tokio::sync::Mutex<Option<LockGuard>>,
    /// Its place in the schedule of lease ends.
    due: Mutex<Option<Slot>>,
}

impl HttpHold {
    fn due(&self) -> std::sync::MutexGuard<'_, Option<Slot>> {
        self.due.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Hashes a token by folding its bits: tokens are random (made here, from a cryptographic
/// generator), so that is as good as a keyed hash and far cheaper; a caller chooses only the
/// tokens it looks up, never the ones in the table.
#[derive(Default)]
pub struct TokenHasher(u64);

impl Hasher for TokenHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    #[allow(clippy::cast_possible_truncation)] // the two halves, folded on purpose
    fn write_u128(&mut self, v: u128) {
        self.0 ^= (v as u64) ^ ((v >> 64) as u64);
    }
}

type Table = HashMap<TokenBits, Arc<HttpHold>, BuildHasherDefault<TokenHasher>>;

/// The bits of a token as this service writes it (32 lowercase hex digits); `None` for any
/// other text, which names no hold. Read digit by digit: only the text this service wrote
/// names a hold (`Token::from_hex` also reads upper case and a sign, and checking its answer
/// by writing it back costs more than reading).
fn token_bits(token: &str) -> Option<TokenBits> {
    let digits = token.as_bytes();
    if digits.len() != 32 {
        return None;
    }
    digits.iter().try_fold(0, |bits: TokenBits, &d| {
        let value = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => return None,
        };
        Some(bits << 4 | TokenBits::from(value))
    })
}

/// The text of a token: what [`token_bits`] reads back.
fn token_text(bits: TokenBits) -> String {
    let hex = Token::from(bits).to_hex_bytes();
    // Hex digits are ASCII (never the empty default); copied without the formatting
    // machinery of `to_string`.
    std::str::from_utf8(&hex).unwrap_or_default().to_owned()
}

/// The holds of this service, by token.
#[derive(Clone)]
pub struct Holds {
    registry: LockRegistry,
    board: Board,
    table: Arc<Mutex<Table>>,
    /// When the holds' leases end; one task ends them (see `new`).
    expiries: Expiries,
    /// The holder name of HTTP holds on the board.
    http: Holder,
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
    /// Holds over `registry`, which must not renew (see the module docs), and the task that
    /// ends them when their leases run out (on the current runtime, for the life of the
    /// service).
    pub fn new(registry: LockRegistry, board: Board, stopping: watch::Receiver<bool>) -> Self {
        let holds = Holds {
            registry,
            board,
            table: Arc::new(Mutex::new(Table::default())),
            expiries: Expiries::default(),
            http: Holder::from("http"),
            stopping,
        };
        let reaper = holds.clone();
        tokio::spawn(async move {
            loop {
                for token in reaper.expiries.next_due().await {
                    reaper.reap(token);
                }
            }
        });
        holds
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
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

    /// `POST /v1/locks/{key}`: one attempt, or waits up to `wait_ms`. The answer names `key`,
    /// moved into it.
    ///
    /// # Cancel safety
    /// Cancel safe (a caller that hangs up drops it): the library's `try_lock_for` leaves nothing
    /// held when dropped, and a hold is only entered in the table after it was acquired.
    pub async fn acquire(
        &self,
        owned_key: String,
        req: AcquireRequest,
        peer: Option<Peer>,
    ) -> Result<Granted, ApiError> {
        let key = owned_key.as_str();
        let kind = kind_of(&req)?;
        let owner = match (&req.owner, peer) {
            (Some(o), _) => {
                Owner::new(o).map_err(|e| ApiError::bad_request(format!("owner: {e}")))?
            }
            (None, Some(Peer(owner))) => owner,
            (None, None) => Owner::new("http")?,
        };
        let lease = lease_of(req.lease_ms)?;
        let wait = req.wait_ms.map(Duration::from_millis);
        if wait.is_some_and(|w| w > MAX_WAIT) {
            return Err(ApiError::bad_request(format!(
                "wait_ms must be at most {}",
                millis(MAX_WAIT)
            )));
        }
        // A backend without this kind answers `Unsupported` here (501), before anything is
        // taken.
        let lock = crate::run::handle(&self.registry, key, kind)?
            .with_lease(lease)?
            .with_owner(owner);
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
                let _ticket = self.board.waiting(key, &self.http);
                tokio::select! {
                    biased;
                    _ = stopping.wait_for(|s| *s) => return Err(ApiError::shutting_down()),
                    got = lock.try_lock_for(wait) => got?,
                }
            }
        };
        let bits = Token::random().as_u128();
        let fence = guard.fence();
        let name = Name::from(key);
        let board_id = self
            .board
            .acquired(name.clone(), &self.http, lock.kind(), fence, lease);
        let ends = Instant::now() + guard.remaining();
        let hold = Arc::new(HttpHold {
            key: name,
            board_id,
            guard: tokio::sync::Mutex::new(Some(guard)),
            due: Mutex::new(None),
        });
        self.table().insert(bits, hold.clone());
        *hold.due() = Some(self.expiries.schedule(ends, board_id, bits));
        // Shutdown releases the holds in the table once it is stopping; one entered after that
        // (acquired while shutdown began) is given back here, so none outlives the service.
        if *self.stopping.borrow() {
            let _ = self.release_bits(key, bits).await;
            return Err(ApiError::shutting_down());
        }
        Ok(Granted {
            key: owned_key,
            token: token_text(bits),
            fence,
            lease_ms: millis(lease),
        })
    }

    /// The hold of `token` if it is one of `key`'s.
    fn find(&self, key: &str, token: TokenBits) -> Option<Arc<HttpHold>> {
        self.table()
            .get(&token)
            .filter(|h| h.key.as_str() == key)
            .cloned()
    }

    /// Takes the hold out of the table (once: a second caller gets `None`).
    fn take(&self, token: TokenBits, hold: &Arc<HttpHold>) -> bool {
        let mut table = self.table();
        match table.get(&token) {
            Some(h) if Arc::ptr_eq(h, hold) => {
                table.remove(&token);
                true
            }
            _ => false,
        }
    }

    /// The hold's lease is due to end: it ends unless it was extended meanwhile. A hold busy
    /// with an extension or a release is looked at once that is done, by a task of its own.
    fn reap(&self, token: TokenBits) {
        let Some(hold) = self.table().get(&token).cloned() else {
            return;
        };
        let busy = match hold.guard.try_lock() {
            Ok(mut slot) => {
                self.end_if_lost(token, &hold, &mut slot);
                false
            }
            Err(_) => true,
        };
        if busy {
            let this = self.clone();
            tokio::spawn(async move { this.expire(token).await });
        }
    }

    /// `reap` for a hold whose guard may be in use: waits for it.
    async fn expire(&self, token: TokenBits) {
        let Some(hold) = self.table().get(&token).cloned() else {
            return;
        };
        let mut slot = hold.guard.lock().await;
        self.end_if_lost(token, &hold, &mut slot);
    }

    /// Ends the hold if its lease ran out (or the backend took it away): the guard's drop
    /// frees the key on the server if our token is still there. A hold still held (extended
    /// meanwhile) goes back into the schedule.
    fn end_if_lost(&self, token: TokenBits, hold: &Arc<HttpHold>, slot: &mut Option<LockGuard>) {
        let Some(guard) = slot.as_ref() else {
            return;
        };
        if guard.is_held() {
            self.reschedule(token, hold, guard);
            return;
        }
        *slot = None;
        if let Some(due) = hold.due().take() {
            self.expiries.unschedule(due);
        }
        if self.take(token, hold) {
            self.board.ended(
                hold.board_id,
                "lost",
                Some("the caller's lease ended".into()),
            );
        }
    }

    /// Puts the hold into the schedule at the end of its lease as the guard counts it now.
    fn reschedule(&self, token: TokenBits, hold: &HttpHold, guard: &LockGuard) {
        let ends = Instant::now() + guard.remaining();
        let mut due = hold.due();
        if let Some(old) = due.take() {
            self.expiries.unschedule(old);
        }
        *due = Some(self.expiries.schedule(ends, hold.board_id, token));
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
        let token = token_bits(token).ok_or_else(ApiError::gone)?;
        let hold = self.find(key, token).ok_or_else(ApiError::gone)?;
        let slot = hold.guard.lock().await;
        let guard = slot.as_ref().ok_or_else(ApiError::gone)?;
        match guard.extend(lease).await {
            Ok(()) => {
                let remaining = guard.remaining();
                self.reschedule(token, &hold, guard);
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
        let token = token_bits(token).ok_or_else(ApiError::gone)?;
        self.release_bits(key, token).await
    }

    /// [`Holds::release`] of a token's bits.
    async fn release_bits(&self, key: &str, token: TokenBits) -> Result<(), ApiError> {
        let hold = self.find(key, token).ok_or_else(ApiError::gone)?;
        let guard = hold.guard.lock().await.take().ok_or_else(ApiError::gone)?;
        self.take(token, &hold);
        if let Some(due) = hold.due().take() {
            self.expiries.unschedule(due);
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
        let tokens: Vec<(TokenBits, Name)> = self
            .table()
            .iter()
            .map(|(t, h)| (*t, h.key.clone()))
            .collect();
        let releases = tokens
            .iter()
            .map(|(token, key)| self.release_bits(key, *token));
        let _ = futures_util::future::join_all(releases).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_token_as_written_names_a_hold() {
        let bits = Token::random().as_u128();
        let text = Token::from(bits).to_string();
        assert_eq!(token_bits(&text), Some(bits));
        assert_eq!(token_text(bits), text);
        assert_eq!(token_bits(&token_text(u128::MAX)), Some(u128::MAX));
        assert_eq!(token_bits(&"0".repeat(32)), Some(0));
        for other in [
            text.to_uppercase(),
            format!("+{}", &text[1..]),
            format!("g{}", &text[1..]),
            format!("{}/", &text[1..]),
            format!("{}:", &text[1..]),
            text[1..].to_owned(),
            format!("{text}0"),
            String::new(),
        ] {
            if other != text {
                assert_eq!(token_bits(&other), None, "{other:?}");
            }
        }
    }
}
