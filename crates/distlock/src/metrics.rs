//! Counters and histograms through the `metrics` facade (cargo feature `metrics`); without the
//! feature every function here is empty and compiles away.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `distlock_acquire_total` | counter | `backend`, `outcome` = `acquired` / `not_acquired` / `error` |
//! | `distlock_acquire_wait_seconds` | histogram | `backend` |
//! | `distlock_release_total` | counter | `backend`, `outcome` = `released` / `lost` / `error` |
//! | `distlock_lost_total` | counter | `backend` |
//! | `distlock_renewals_total` | counter | `backend`, `outcome` = `ok` / `denied` / `error` |

use std::time::Duration;

#[cfg(feature = "metrics")]
pub(crate) fn acquire(backend: &'static str, outcome: &'static str, waited: Duration) {
    metrics::counter!("distlock_acquire_total", "backend" => backend, "outcome" => outcome)
        .increment(1);
    metrics::histogram!("distlock_acquire_wait_seconds", "backend" => backend)
        .record(waited.as_secs_f64());
}

#[cfg(feature = "metrics")]
pub(crate) fn release(backend: &'static str, outcome: &'static str) {
    metrics::counter!("distlock_release_total", "backend" => backend, "outcome" => outcome)
        .increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn lost(backend: &'static str) {
    metrics::counter!("distlock_lost_total", "backend" => backend).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn renewals(backend: &'static str, outcome: &'static str, n: u64) {
    metrics::counter!("distlock_renewals_total", "backend" => backend, "outcome" => outcome)
        .increment(n);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn acquire(_: &'static str, _: &'static str, _: Duration) {}

#[cfg(not(feature = "metrics"))]
pub(crate) fn release(_: &'static str, _: &'static str) {}

#[cfg(not(feature = "metrics"))]
pub(crate) fn lost(_: &'static str) {}

#[cfg(not(feature = "metrics"))]
pub(crate) fn renewals(_: &'static str, _: &'static str, _: u64) {}
