//! The worked example of docs/ARCHITECTURE.md ("A new backend, worked"): a whole backend in
//! one file, a table of leases in this process's memory with one mutex per key, and the
//! conformance suite run on it. Everything else (the local lock first, waiting, renewal,
//! lost-lock signals, fence composition, cancel safety, multi-key locks, elections) comes from
//! the registry; the suite skips only what the capabilities below do not claim (read-write
//! locks, semaphores, release notifications, fair queues, other processes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    AcquireRequest, Attempt, Backend, Capabilities, Error, Fencing, ListedLock, LockInfo, LockKind,
    LockName, Released, Result, Token,
};
use distlock_testkit::conformance::Harness;
use tokio::time::Instant;

// ---- the engine: a lease table ------------------------------------------------------------

/// One row of the table: who holds the key, until when, and the key's fence counter (kept
/// after a release, so that fences only grow).
#[derive(Debug, Default)]
struct Row {
    holder: Option<(Token, Instant, String)>,
    fence: u64,
}

impl Row {
    /// The holder, if its lease has not run out.
    fn live(&self, now: Instant) -> Option<&(Token, Instant, String)> {
        self.holder.as_ref().filter(|(_, until, _)| *until > now)
    }

    fn info(&self, now: Instant) -> Option<LockInfo> {
        let (_, until, owner) = self.live(now)?;
        Some(
            LockInfo::new(Some(self.fence), Some(*until - now))
                .with_kind(LockKind::Mutex)
                .with_holders(1)
                .with_owners([owner.clone()]),
        )
    }
}

/// The toy backend: rows by `prefix:key`, behind one mutex (each operation is one atomic
/// step, as one statement or script is on a server).
#[derive(Debug, Default)]
pub struct ToyBackend {
    rows: Mutex<HashMap<String, Row>>,
}

fn poisoned() -> Error {
    Error::Backend {
        backend: "toy",
        message: "the table's lock is poisoned".into(),
    }
}

fn row_key(name: &LockName) -> String {
    format!("{}:{}", name.prefix(), name.key())
}

impl ToyBackend {
    /// Runs `f` on the row of `name`, created empty if missing.
    fn with_row<T>(&self, name: &LockName, f: impl FnOnce(&mut Row) -> T) -> Result<T> {
        let mut rows = self.rows.lock().map_err(|_| poisoned())?;
        Ok(f(rows.entry(row_key(name)).or_default()))
    }
}

#[async_trait]
impl Backend for ToyBackend {
    fn capabilities(&self) -> Capabilities {
        // Mutexes only, in this process, fences that grow for as long as the table lives,
        // owners recorded; nothing else is claimed, so nothing else is promised or tested.
        Capabilities::new("toy")
            .fencing(Fencing::Monotonic)
            .cross_process(false)
            .owners(true)
    }

    /// Take the row if it is free (or its lease ran out) or already ours.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        if request.name.kind() != LockKind::Mutex {
            return Err(Error::Unsupported {
                backend: "toy",
                what: "locks other than mutexes".into(),
            });
        }
        let now = Instant::now();
        let owner = request.owner_str().to_owned();
        self.with_row(&request.name, |row| match row.live(now) {
            Some((token, until, _)) if *token != request.token => Attempt::Busy {
                retry_after: Some(*until - now),
                ahead: None,
            },
            _ => {
                row.fence += 1;
                row.holder = Some((request.token, now + request.lease, owner));
                Attempt::Acquired { fence: row.fence }
            }
        })
    }

    /// Free the row only if `token` holds it: the owner-checked release.
    async fn release(&self, name: &LockName, token: Token) -> Result<Released> {
        let now = Instant::now();
        self.with_row(name, |row| {
            let ours = row.live(now).is_some_and(|(t, _, _)| *t == token);
            if ours {
                row.holder = None;
            }
            Released {
                was_held: ours,
                ..Released::default()
            }
        })
    }

    /// Reset the lease only if `token` still holds the row.
    async fn extend(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let now = Instant::now();
        self.with_row(name, |row| match &mut row.holder {
            Some((t, until, _)) if *t == token && *until > now => {
                *until = now + lease;
                true
            }
            _ => false,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        self.with_row(name, |row| row.info(now))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let now = Instant::now();
        self.with_row(name, |row| {
            row.live(now).is_some() && row.holder.take().is_some()
        })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let now = Instant::now();
        let rows = self.rows.lock().map_err(|_| poisoned())?;
        let mut listed: Vec<ListedLock> = rows
            .iter()
            .filter_map(|(k, row)| {
                let key = k.strip_prefix(prefix)?.strip_prefix(':')?;
                Some(ListedLock {
                    key: key.to_owned(),
                    info: row.info(now)?,
                })
            })
            .collect();
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }
}

// ---- the conformance suite on it ----------------------------------------------------------

/// One table shared by every registry of a test (it is in-process, as memory:// is).
async fn toy() -> Harness {
    let backend: Arc<dyn Backend> = Arc::new(ToyBackend::default());
    Harness::new(move || {
        let b = backend.clone();
        async move { Ok(b) }
    })
}

distlock_testkit::conformance_suite!(on_toy, toy);
