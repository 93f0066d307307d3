//! The articles' demonstration inside the service: the workers of `distlock demo`, each with
//! its own registry, take the key in turn; the board shows them waiting and holding.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::events::{Board, Name, WaiterTicket};
use super::{ApiError, Service};
use crate::demo::{registries, worker, Report, Step};

/// Where each worker is on the board.
#[derive(Default)]
struct Shown {
    waiting: Option<WaiterTicket>,
    hold: Option<u64>,
}

/// Connects the workers' registries, then starts them and returns.
///
/// # Cancel safety
/// Cancel safe: dropped while connecting, nothing has started; once it returns the workers run
/// on their own.
pub async fn start(
    service: &Service,
    key: String,
    workers: u32,
    hold: Duration,
) -> Result<(), ApiError> {
    let first = service.holds.registry().backend().clone();
    let registries = registries(first, &service.backend_url, &service.options, workers).await?;
    let board = service.board.clone();
    let shown: Arc<Mutex<HashMap<usize, Shown>>> = Arc::default();
    let report: Report = Arc::new(move |n, key, step| show(&board, &shown, n, key, step));
    let start = Instant::now();
    for (i, registry) in registries.into_iter().enumerate() {
        let run = worker(
            i + 1,
            registry,
            key.clone(),
            hold,
            start,
            service.stopping.clone(),
            report.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = run.await {
                tracing::debug!(error = %e, "demo worker failed");
            }
        });
    }
    Ok(())
}

fn show(board: &Board, shown: &Mutex<HashMap<usize, Shown>>, n: usize, key: &str, step: Step) {
    let mut shown = shown.lock().unwrap_or_else(|e| e.into_inner());
    let entry = shown.entry(n).or_default();
    let holder = Name::from(format!("demo worker {n}").as_str());
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
