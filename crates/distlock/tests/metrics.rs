//! The `metrics` feature reports acquisitions, releases and losses.

use std::time::Duration;

use distlock::backends::memory::MemoryBackend;
use distlock::{LockRegistry, RegistryOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[tokio::test]
async fn acquisitions_releases_and_losses_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("first recorder of this test binary");

    let reg = LockRegistry::new(MemoryBackend::new());
    let g = reg.obtain("m").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    let held = reg.obtain("m").unwrap().lock().await.unwrap();
    assert!(reg.obtain("m").unwrap().try_lock().await.is_err());
    held.release().await.unwrap();
    let short = LockRegistry::with_options(
        MemoryBackend::new(),
        RegistryOptions::default()
            .with_renew(false)
            .with_lease(Duration::from_millis(50)),
    )
    .unwrap();
    let g = short.obtain("m").unwrap().lock().await.unwrap();
    g.lost().await;

    type Counter = (String, Vec<(String, String)>, u64);
    let counters: Vec<Counter> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((
                key.key().name().to_owned(),
                key.key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                n,
            )),
            _ => None,
        })
        .collect();
    let count = |name: &str, outcome: Option<&str>| -> u64 {
        counters
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && outcome.is_none_or(|o| labels.iter().any(|(k, v)| k == "outcome" && v == o))
            })
            .map(|(_, _, c)| *c)
            .sum()
    };
    assert_eq!(
        count("distlock_acquire_total", Some("acquired")),
        3,
        "{counters:?}"
    );
    assert_eq!(
        count("distlock_acquire_total", Some("not_acquired")),
        1,
        "{counters:?}"
    );
    assert_eq!(
        count("distlock_release_total", Some("released")),
        2,
        "{counters:?}"
    );
    assert_eq!(count("distlock_lost_total", None), 1, "{counters:?}");
}
