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
mod keys {
    use std::cell::RefCell;

    use metrics::{Key, Label, Level, Metadata};

    /// What `metrics::counter!` and `histogram!` pass for a call in this module.
    pub(super) static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    /// A metric's name and labels: all `'static`, compared by content.
    type Parts = (&'static str, &'static str, Option<&'static str>);

    thread_local! {
        /// The keys made on this thread. The macros, given labels that are not literals,
        /// build a key on every call (a vector of labels, then its hash), which costs more
        /// than the recorder's own work; only keys are kept here, never the recorder's
        /// handles, so that every call still reaches whichever recorder is current (a local
        /// one included). A process has a handful: one per backend kind and outcome.
        static KEYS: RefCell<Vec<(Parts, Key)>> = const { RefCell::new(Vec::new()) };
    }

    /// Calls `f` with the key of `name` with the label `backend` and, if given, `outcome`.
    pub(super) fn with<T>(
        name: &'static str,
        backend: &'static str,
        outcome: Option<&'static str>,
        f: impl FnOnce(&Key) -> T,
    ) -> T {
        let parts = (name, backend, outcome);
        KEYS.with(|keys| {
            // `try_`: a recorder that counted distlock's metrics from inside a call would
            // find the cache in use, and make its own key.
            if let Ok(keys) = keys.try_borrow() {
                if let Some((_, key)) = keys.iter().find(|(p, _)| *p == parts) {
                    return f(key);
                }
            }
            let mut labels = vec![Label::from_static_parts("backend", backend)];
            if let Some(outcome) = outcome {
                labels.push(Label::from_static_parts("outcome", outcome));
            }
            let key = Key::from_parts(name, labels);
            let answer = f(&key);
            if let Ok(mut keys) = keys.try_borrow_mut() {
                keys.push((parts, key));
            }
            answer
        })
    }
}

#[cfg(feature = "metrics")]
fn count(name: &'static str, backend: &'static str, outcome: Option<&'static str>, n: u64) {
    keys::with(name, backend, outcome, |key| {
        metrics::with_recorder(|r| r.register_counter(key, &keys::METADATA)).increment(n);
    });
}

#[cfg(feature = "metrics")]
pub(crate) fn acquire(backend: &'static str, outcome: &'static str, waited: Duration) {
    count("distlock_acquire_total", backend, Some(outcome), 1);
    keys::with("distlock_acquire_wait_seconds", backend, None, |key| {
        metrics::with_recorder(|r| r.register_histogram(key, &keys::METADATA))
            .record(waited.as_secs_f64());
    });
}

#[cfg(feature = "metrics")]
pub(crate) fn release(backend: &'static str, outcome: &'static str) {
    count("distlock_release_total", backend, Some(outcome), 1);
}

#[cfg(feature = "metrics")]
pub(crate) fn lost(backend: &'static str) {
    count("distlock_lost_total", backend, None, 1);
}

#[cfg(feature = "metrics")]
pub(crate) fn renewals(backend: &'static str, outcome: &'static str, n: u64) {
    count("distlock_renewals_total", backend, Some(outcome), n);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn acquire(_: &'static str, _: &'static str, _: Duration) {}

#[cfg(not(feature = "metrics"))]
pub(crate) fn release(_: &'static str, _: &'static str) {}

#[cfg(not(feature = "metrics"))]
pub(crate) fn lost(_: &'static str) {}

#[cfg(not(feature = "metrics"))]
pub(crate) fn renewals(_: &'static str, _: &'static str, _: u64) {}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    /// A metric as seen: its name, its labels, its value as text.
    type Seen = (String, Vec<(String, String)>, String);

    /// Every counter and histogram sample `recorder` got.
    fn seen(recorder: &DebuggingRecorder) -> Vec<Seen> {
        let mut all: Vec<_> = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                let value = match value {
                    DebugValue::Counter(n) => n.to_string(),
                    DebugValue::Histogram(v) => {
                        format!("{:?}", v.iter().map(|f| f.0).collect::<Vec<f64>>())
                    }
                    DebugValue::Gauge(g) => format!("gauge {g:?}"),
                };
                (key.key().name().to_owned(), labels, value)
            })
            .collect();
        all.sort();
        all
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn metrics_keep_their_names_and_labels_and_reach_each_current_recorder() {
        // Two recorders in turn on one thread: keys made for the first serve the second, and
        // each gets only its own calls.
        for round in 1..=2u64 {
            let recorder = DebuggingRecorder::new();
            metrics::with_local_recorder(&recorder, || {
                for _ in 0..round {
                    acquire("memory", "acquired", Duration::from_millis(250));
                    release("memory", "released");
                }
                release("redis", "lost");
                lost("memory");
                renewals("memory", "ok", 3);
            });
            let n = round.to_string();
            assert_eq!(
                seen(&recorder),
                [
                    (
                        "distlock_acquire_total".into(),
                        labels(&[("backend", "memory"), ("outcome", "acquired")]),
                        n.clone()
                    ),
                    (
                        "distlock_acquire_wait_seconds".into(),
                        labels(&[("backend", "memory")]),
                        format!("{:?}", vec![0.25f64; round as usize])
                    ),
                    (
                        "distlock_lost_total".into(),
                        labels(&[("backend", "memory")]),
                        "1".into()
                    ),
                    (
                        "distlock_release_total".into(),
                        labels(&[("backend", "memory"), ("outcome", "released")]),
                        n
                    ),
                    (
                        "distlock_release_total".into(),
                        labels(&[("backend", "redis"), ("outcome", "lost")]),
                        "1".into()
                    ),
                    (
                        "distlock_renewals_total".into(),
                        labels(&[("backend", "memory"), ("outcome", "ok")]),
                        "3".into()
                    ),
                ],
                "round {round}"
            );
        }
    }
}
