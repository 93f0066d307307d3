//! `GET /v1/locks`: every lock under the prefix as the backend lists it (the objects of
//! `distlock list --json`), with this service's own holds and waiters beside them.
//!
//! A backend that cannot list (`Error::Unsupported`) gets the board's view instead, marked
//! `complete: false`: the holds and waiters of this service only.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use distlock::{Error, LockInfo, LockKind, LockRegistry};
use serde::Serialize;

use super::events::{epoch_ms, Board, Event, ShownHold, ShownWaiter};
use super::ApiError;
use crate::status::{status_json, StatusJson};

/// What this service itself has on one key.
#[derive(Default)]
struct Here {
    holds: u32,
    waiters: u32,
}

/// Counts this service's holds and waiters by key.
fn by_key<'a>(holds: &'a [ShownHold], waiters: &'a [ShownWaiter]) -> HashMap<&'a str, Here> {
    let mut here: HashMap<&str, Here> = HashMap::new();
    for h in holds {
        here.entry(h.key.as_str()).or_default().holds += 1;
    }
    for w in waiters {
        here.entry(w.key.as_str()).or_default().waiters += 1;
    }
    here
}

/// One `list --json` object, with what this service has of the key.
#[derive(Serialize, utoipa::ToSchema)]
struct ListedJson<'a> {
    #[serde(flatten)]
    status: StatusJson<'a>,
    /// Holds of this service on the key.
    holds_here: u32,
    /// Callers of this service waiting for the key.
    waiting_here: u32,
    /// The holders that are not this service's; `None` where the backend does not say how
    /// many hold the key, or cannot list at all.
    other_holders: Option<u32>,
}

/// `ours`: how many of the key's holders are this service's, `None` when unknown.
fn lock_object<'a>(
    key: &'a str,
    registry: &'a LockRegistry,
    info: &LockInfo,
    here: Option<&Here>,
    ours: Option<u32>,
) -> ListedJson<'a> {
    ListedJson {
        status: status_json(
            key,
            registry.options().prefix(),
            registry.backend().kind(),
            Some(info),
        ),
        holds_here: here.map_or(0, |h| h.holds),
        waiting_here: here.map_or(0, |h| h.waiters),
        other_holders: ours.and_then(|n| info.holders.map(|all| all.saturating_sub(n))),
    }
}

/// The answer of `GET /v1/locks`; the field order is the output's.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct ListAnswer<'a> {
    complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<&'static str>,
    locks: Vec<ListedJson<'a>>,
    holds: &'a [ShownHold],
    waiters: &'a [ShownWaiter],
    seq: u64,
    now_ms: u64,
    timeline: Vec<&'a Event>,
}

/// The answer of `GET /v1/locks`, as JSON text.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn list(registry: &LockRegistry, board: &Board) -> Result<String, ApiError> {
    // The board before and after the backend's list: a hold of this service that began or
    // ended meanwhile may or may not be in the list, so it counts as ours either way, and
    // `other_holders` never counts one of ours as somebody else's.
    let (before, _, _) = board.snapshot();
    let listed = registry.backend().list(registry.options().prefix()).await;
    let (holds, waiters, seq) = board.snapshot();
    let now = SystemTime::now();
    let here = by_key(&holds, &waiters);
    let mut listed = match listed {
        Ok(listed) => Some(listed),
        Err(Error::Unsupported { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let complete = listed.is_some();
    if let Some(listed) = listed.as_mut() {
        listed.sort_by(|a, b| a.key.cmp(&b.key));
    }
    let locks = match listed.as_ref() {
        Some(listed) => {
            let mut ours: HashMap<&str, Vec<u64>> = HashMap::new();
            for h in before.iter().chain(&holds) {
                let ids = ours.entry(h.key.as_str()).or_default();
                if !ids.contains(&h.hold) {
                    ids.push(h.hold);
                }
            }
            listed
                .iter()
                .map(|l| {
                    let n = ours.get(l.key.as_str()).map_or(0, Vec::len);
                    let n = u32::try_from(n).unwrap_or(u32::MAX);
                    lock_object(&l.key, registry, &l.info, here.get(l.key.as_str()), Some(n))
                })
                .collect()
        }
        None => from_board(registry, &holds, &here, now),
    };
    let timeline = board.timeline();
    let answer = ListAnswer {
        complete,
        note: (!complete).then_some(
            "this backend cannot list its locks: only the holds and waiters of this service are listed",
        ),
        locks,
        holds: &holds,
        waiters: &waiters,
        seq,
        now_ms: epoch_ms(now),
        timeline: timeline.iter().collect(),
    };
    serde_json::to_string(&answer).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write the list: {e}"),
        )
    })
}

/// The locks of this service's own holds, in the shape of `list --json` (`holds` sorted by
/// key): what the board knows when the backend cannot list.
fn from_board<'a>(
    registry: &'a LockRegistry,
    holds: &'a [ShownHold],
    here: &HashMap<&str, Here>,
    now: SystemTime,
) -> Vec<ListedJson<'a>> {
    let now_ms = epoch_ms(now);
    holds
        .chunk_by(|a, b| a.key == b.key)
        .map(|group| {
            let key = &group[0].key;
            let fence = group.iter().map(|h| h.fence).max().unwrap_or(0);
            let expires = group.iter().map(|h| h.expires_at_ms).max().unwrap_or(0);
            let kind: LockKind = group[0].lock_kind;
            let n = u32::try_from(group.len()).unwrap_or(u32::MAX);
            let mut info = LockInfo::new(
                Some(fence >> 10),
                Some(Duration::from_millis(expires.saturating_sub(now_ms))),
            )
            .with_kind(kind)
            .with_holders(n);
            let mine = here.get(key.as_str());
            if let Some(h) = mine {
                info = info.with_waiters(h.waiters);
            }
            // The board cannot see holders elsewhere.
            lock_object(key, registry, &info, mine, None)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::backends::memory::MemoryBackend;
    use distlock::{AcquireRequest, Attempt, Backend, Capabilities, LockName, Released, Token};

    /// A backend of another crate that implements only the required methods: it cannot list.
    #[derive(Debug, Default)]
    struct Unlisted(MemoryBackend);

    #[async_trait::async_trait]
    impl Backend for Unlisted {
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        async fn acquire(&self, r: &AcquireRequest) -> distlock::Result<Attempt> {
            self.0.acquire(r).await
        }
        async fn release(&self, n: &LockName, t: Token) -> distlock::Result<Released> {
            self.0.release(n, t).await
        }
        async fn extend(&self, n: &LockName, t: Token, l: Duration) -> distlock::Result<bool> {
            self.0.extend(n, t, l).await
        }
        async fn inspect(&self, n: &LockName) -> distlock::Result<Option<LockInfo>> {
            self.0.inspect(n).await
        }
    }

    #[tokio::test]
    async fn a_backend_that_cannot_list_gets_the_boards_view_marked_incomplete() {
        let registry = LockRegistry::new(Unlisted::default());
        let board = Board::default();
        let guard = registry.obtain("k").unwrap().lock().await.unwrap();
        board.acquired(
            "k",
            &"http".into(),
            LockKind::Mutex,
            guard.fence(),
            Duration::from_secs(30),
        );
        let answer: serde_json::Value =
            serde_json::from_str(&list(&registry, &board).await.unwrap()).unwrap();
        assert_eq!(answer["complete"], false, "{answer}");
        assert!(answer["note"].is_string(), "{answer}");
        assert_eq!(answer["locks"][0]["key"], "k", "{answer}");
        assert_eq!(answer["locks"][0]["holds_here"], 1, "{answer}");
        guard.release().await.unwrap();
    }
}
