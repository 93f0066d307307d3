//! The articles' demonstration inside the service (`POST /demo`): the workers of
//! `distlock demo` take the key in turn; the board shows them waiting and holding.
//!
//! Each worker has a registry of its own, so each queues and contends on the backend as a
//! separate instance of a service would; the registries share the service's backend (its
//! connections), so a demonstration opens no connection. It is bounded: at most
//! [`MAX_WORKERS`] workers holding at most [`MAX_HOLD`] each, and one demonstration at a time.
//! At shutdown the holder releases at once, each waiting worker takes the key in turn and
//! gives it back at once, and the service waits for that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::LockRegistry;
use serde::{Deserialize, Serialize};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::events::{millis, Board, DemoReport, Holder, WaiterTicket};
use super::{ApiError, Service};
use crate::demo::{gaps, hold_then_release, release, Report, Step};

/// Most workers a demonstration may have.
pub const MAX_WORKERS: u32 = 10;
/// Longest hold a demonstration's worker may have.
pub const MAX_HOLD: Duration = Duration::from_secs(5);
/// Shortest hold: below it the gaps would show the machine's scheduling, not the lock.
pub const MIN_HOLD: Duration = Duration::from_millis(10);
const DEFAULT_HOLD: Duration = Duration::from_secs(3);

/// The body of `POST /demo`; every field is optional.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DemoRequest {
    /// Default `demo`.
    pub key: Option<String>,
    /// Default (and at most) [`MAX_WORKERS`].
    pub workers: Option<u32>,
    /// Default 3 s, at most [`MAX_HOLD`].
    pub hold_ms: Option<u64>,
}

/// What `POST /demo` answers (202): the demonstration's id, which its events carry as `demo`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Started {
    pub demo: u64,
    pub key: String,
    pub workers: u32,
    pub hold_ms: u64,
}

/// The demonstration running, if any.
#[derive(Default)]
pub struct Demos {
    running: Mutex<Running>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Running {
    /// The last demonstration started.
    last: Option<Last>,
    /// Set at shutdown: no demonstration starts after the service waited for the last one.
    closed: bool,
}

struct Last {
    key: String,
    task: JoinHandle<()>,
    /// Set just before `demo_ended` is published, so that a caller who saw that event can
    /// start the next demonstration at once.
    ended: Arc<AtomicBool>,
}

/// Where each worker is on the board.
#[derive(Default)]
struct Shown {
    waiting: Option<WaiterTicket>,
    hold: Option<u64>,
}

impl Demos {
    /// Starts a demonstration and returns; a second one while the first runs is refused (409).
    pub fn start(&self, service: &Service, req: DemoRequest) -> Result<Started, ApiError> {
        let key = req.key.unwrap_or_else(|| "demo".into());
        distlock::validate_key(&key)?;
        let workers = req.workers.unwrap_or(MAX_WORKERS);
        if !(1..=MAX_WORKERS).contains(&workers) {
            return Err(ApiError::bad_request(format!(
                "workers must be 1 to {MAX_WORKERS}"
            )));
        }
        let hold = req.hold_ms.map_or(DEFAULT_HOLD, Duration::from_millis);
        if hold < MIN_HOLD || hold > MAX_HOLD {
            return Err(ApiError::bad_request(format!(
                "hold_ms must be {} to {}",
                millis(MIN_HOLD),
                millis(MAX_HOLD)
            )));
        }
        let backend = service.holds.registry().backend().clone();
        let registries = (0..workers)
            .map(|_| LockRegistry::from_backend(backend.clone(), service.options.clone()))
            .collect::<distlock::Result<Vec<_>>>()?;

        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.closed {
            return Err(ApiError::shutting_down());
        }
        if let Some(last) = running.last.as_ref() {
            if !last.ended.load(Ordering::Acquire) {
                return Err(ApiError::conflict(format!(
                    "a demonstration (of lock {:?}) is running: one at a time",
                    last.key
                )));
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let report = DemoReport {
            workers,
            hold_ms: millis(hold),
            acquisitions: None,
            min_gap_ms: None,
            max_gap_ms: None,
            stopped: false,
        };
        service
            .board
            .demonstration("demo_started", &key, id, report.clone());
        let ended = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run(
            id,
            ended.clone(),
            registries,
            key.clone(),
            service.board.clone(),
            service.stopping.clone(),
            report,
        ));
        running.last = Some(Last {
            key: key.clone(),
            task,
            ended,
        });
        Ok(Started {
            demo: id,
            key,
            workers,
            hold_ms: millis(hold),
        })
    }

    /// At shutdown, once `stopping` is set: waits up to `bound` for the running
    /// demonstration's workers to stop and its holder to release; none starts afterwards
    /// (503), so none is left running when the process exits.
    pub async fn finish(&self, bound: Duration) {
        let task = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            running.closed = true;
            running.last.take()
        };
        if let Some(last) = task {
            if tokio::time::timeout(bound, last.task).await.is_err() {
                tracing::debug!("the demonstration did not stop within the drain time");
            }
        }
    }
}

/// The workers, one task each (each holding for `report.hold_ms`), then the closing
/// `demo_ended` event.
async fn run(
    id: u64,
    ended: Arc<AtomicBool>,
    registries: Vec<LockRegistry>,
    key: String,
    board: Board,
    stopping: tokio::sync::watch::Receiver<bool>,
    mut report: DemoReport,
) {
    // Whole milliseconds: the hold was given in them.
    let hold = Duration::from_millis(report.hold_ms);
    let shown: Arc<Mutex<HashMap<usize, Shown>>> = Arc::default();
    let steps: Report = {
        let board = board.clone();
        Arc::new(move |n, key, step| show(&board, &shown, id, n, key, step))
    };
    let start = Instant::now();
    let mut workers = JoinSet::new();
    for (i, registry) in registries.into_iter().enumerate() {
        workers.spawn(worker(
            i + 1,
            registry,
            key.clone(),
            hold,
            start,
            stopping.clone(),
            steps.clone(),
        ));
    }
    let mut acquired = Vec::new();
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(Ok(Some(at))) => acquired.push(at),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "demo worker failed"),
            Err(e) => tracing::debug!(error = %e, "demo worker panicked"),
        }
    }
    let (min, max) = gaps(&mut acquired);
    report.acquisitions = u32::try_from(acquired.len()).ok();
    report.min_gap_ms = min.map(|d| d.as_secs_f64() * 1000.0);
    report.max_gap_ms = max.map(|d| d.as_secs_f64() * 1000.0);
    report.stopped = *stopping.borrow();
    ended.store(true, Ordering::Release);
    board.demonstration("demo_ended", &key, id, report);
}

/// One worker: wait for the key, hold it for `hold` (less once the service stops), release
/// it. Returns when it got the key, or `None` when the service stopped first.
///
/// A waiting worker is not cancelled at shutdown: a wait dropped while its attempt is in
/// flight may still acquire, and the library then gives the key back from a task of its own,
/// which the exiting process would cut off, leaving the key held for its lease. So a waiter
/// finishes its wait (the holder has released by then) and releases at once; the service
/// waits for that, up to its drain time.
async fn worker(
    n: usize,
    registry: LockRegistry,
    key: String,
    hold: Duration,
    start: Instant,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    report: Report,
) -> distlock::Result<Option<Duration>> {
    let lock = registry.obtain(&key)?;
    report(n, &key, Step::Waiting);
    let guard = match lock.lock().await {
        Ok(guard) => guard,
        Err(e) => {
            report(n, &key, Step::Done);
            return Err(e);
        }
    };
    if *stopping.borrow() {
        report(n, &key, Step::Done);
        release(guard).await?;
        return Ok(None);
    }
    let at = start.elapsed();
    let stopped = async {
        let _ = stopping.wait_for(|s| *s).await;
    };
    hold_then_release(n, &key, guard, at, hold, stopped, &report).await?;
    Ok(Some(at))
}

fn show(
    board: &Board,
    shown: &Mutex<HashMap<usize, Shown>>,
    demo: u64,
    n: usize,
    key: &str,
    step: Step,
) {
    let mut shown = shown.lock().unwrap_or_else(|e| e.into_inner());
    let entry = shown.entry(n).or_default();
    let holder = Holder {
        name: format!("demo worker {n}").as_str().into(),
        demo: Some(demo),
    };
    match step {
        Step::Waiting => entry.waiting = Some(board.waiting(key, &holder)),
        Step::Acquired { fence, hold, .. } => {
            entry.waiting = None;
            let kind = distlock::LockKind::Mutex;
            entry.hold = Some(board.acquired(key, &holder, kind, fence, hold));
        }
        Step::Lost | Step::Done => {
            entry.waiting = None;
            if let Some(id) = entry.hold.take() {
                let kind = if matches!(step, Step::Lost) {
                    "lost"
                } else {
                    "released"
                };
                board.ended(id, kind, None);
            }
        }
    }
}
