//! `GET /metrics`: the library's counters (its `metrics` feature) and the service's own, in
//! Prometheus text through a process-wide recorder.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `distlock_http_requests_total` | counter | `status` |
//! | `distlock_http_holds` | gauge | |
//! | `distlock_http_waiters` | gauge | |

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::config::{Failure, EXIT_BACKEND};

/// Installs the recorder; fails if another one is installed.
pub fn install() -> Result<PrometheusHandle, Failure> {
    PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Failure {
            code: EXIT_BACKEND,
            message: format!("cannot install the metrics recorder: {e}"),
        })
}

/// Counts one answered request.
pub fn request(status: u16) {
    metrics::counter!("distlock_http_requests_total", "status" => status.to_string()).increment(1);
}

/// Sets the gauges just before a scrape.
#[allow(clippy::cast_precision_loss)] // counts far below 2^52
pub fn gauges(holds: usize, waiters: usize) {
    metrics::gauge!("distlock_http_holds").set(holds as f64);
    metrics::gauge!("distlock_http_waiters").set(waiters as f64);
}
