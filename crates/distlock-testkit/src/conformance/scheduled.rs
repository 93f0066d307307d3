//! Scheduled jobs: a hold kept at least a while after it was acquired (ShedLock's
//! `lockAtLeastFor`), whether released, dropped or waited for in the same process.

use std::time::Duration;

use tokio::time::Instant;

use super::{within, Harness};
use distlock::Error;

/// A lock `with_at_least` stays held until its at-least time after a quick release or drop:
/// another registry finds it busy, a task of the same registry is not handed it, and both
/// get it once the time is up.
pub async fn at_least_keeps_a_quick_job_locked(h: &Harness) {
    let at_least = Duration::from_millis(600);
    let (a, b) = (h.registry().await, h.registry().await);
    let limit = h.limit(Duration::from_secs(5), 20).await;
    for drop_it in [false, true] {
        let job = a.obtain("job").unwrap().with_at_least(at_least).unwrap();
        assert_eq!(job.at_least(), Some(at_least));
        let started = Instant::now();
        let guard = job.lock().await.unwrap();
        if drop_it {
            drop(guard);
        } else {
            guard.release().await.unwrap();
            assert!(started.elapsed() >= at_least, "release returned early");
        }
        // Still within the at-least time (a quick check after a drop; none left after a
        // release, which waited).
        if drop_it && started.elapsed() < at_least / 2 {
            assert!(
                matches!(
                    b.obtain("job").unwrap().try_lock().await,
                    Err(Error::NotAcquired { .. })
                ),
                "another registry took the job within its at-least time"
            );
        }
        let local = within(
            limit,
            "the same registry's next holder",
            a.obtain("job").unwrap().lock(),
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() >= at_least,
            "handed on locally within the at-least time"
        );
        local.release().await.unwrap();
        let other = within(
            limit,
            "another registry's holder",
            b.obtain("job").unwrap().lock(),
        )
        .await
        .unwrap();
        other.release().await.unwrap();
    }
    assert!(a
        .obtain("job")
        .unwrap()
        .with_at_least(Duration::from_secs(2 * 86_400))
        .is_err());
}
