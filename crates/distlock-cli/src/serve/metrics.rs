//! `GET /metrics`: the library's counters (its `metrics` feature) and the service's own, in
//! Prometheus text through a process-wide recorder.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `distlock_http_requests_total` | counter | `status` |
//! | `distlock_http_holds` | gauge | |
//! | `distlock_http_waiters` | gauge | |

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::config::{Failure, EXIT_BACKEND};

/// How often histogram samples are folded into their summaries when nobody scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// The statuses the service answers, whose counters are looked up once.
const STATUSES: [u16; 13] = [
    200, 204, 400, 401, 404, 405, 409, 410, 413, 415, 500, 501, 503,
];

/// Installs the recorder (fails if another one is installed) and, on the current runtime,
/// its upkeep: the recorder keeps every histogram sample (`distlock_acquire_wait_seconds`, one
/// per acquisition) until a scrape or an upkeep folds them in, so without it a service nobody
/// scrapes would grow without bound.
pub fn install() -> Result<PrometheusHandle, Failure> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Failure {
            code: EXIT_BACKEND,
            message: format!("cannot install the metrics recorder: {e}"),
        })?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

fn requests_counter(status: u16) -> metrics::Counter {
    metrics::counter!("distlock_http_requests_total", "status" => status.to_string())
}

/// Counts one answered request. The counters of the usual statuses are looked up once (a
/// lookup builds the labels and hashes them: more than the rest of the count).
pub fn request(status: u16) {
    static KNOWN: OnceLock<Vec<(u16, metrics::Counter)>> = OnceLock::new();
    let known = KNOWN.get_or_init(|| STATUSES.map(|s| (s, requests_counter(s))).to_vec());
    match known.iter().find(|(s, _)| *s == status) {
        Some((_, counter)) => counter.increment(1),
        None => requests_counter(status).increment(1),
    }
}

/// Sets the gauges just before a scrape.
#[allow(clippy::cast_precision_loss)] // counts far below 2^52
pub fn gauges(holds: usize, waiters: usize) {
    metrics::gauge!("distlock_http_holds").set(holds as f64);
    metrics::gauge!("distlock_http_waiters").set(waiters as f64);
}
