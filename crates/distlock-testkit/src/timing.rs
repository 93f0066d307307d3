//! Time limits for tests that derive from what this machine measures now, so that a test that
//! checks "by the deadline" holds on a loaded 2-CPU machine and still fails when something
//! really waits for a lease, a poll period or a timeout it should not.

use std::time::Duration;

use tokio::time::Instant;

/// A margin for "this happens by that deadline": 300 ms plus twenty times the worst lateness of
/// a few short timer sleeps on the current runtime, measured now.
///
/// On an idle machine this is about 300 ms; while compilers or other tests load every CPU the
/// runtime's timers and threads run late, and the margin grows with them.
pub async fn scheduling_slack() -> Duration {
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let asked = Duration::from_millis(2);
        let started = Instant::now();
        tokio::time::sleep(asked).await;
        worst = worst.max(started.elapsed().saturating_sub(asked));
    }
    Duration::from_millis(300) + worst * 20
}

/// Checks the next waiter's attempt `got`, which returned just now, after a waiter died at
/// `died`: it got the lock once the dead waiter's `what` (key, node) was gone, within `expiry`
/// plus a few round trips (the wake-up, the listings, the claim): twice the scheduling slack,
/// `slack` as measured before the death or now, whichever is worse. Gives the lock back.
///
/// # Panics
/// When the attempt failed or took longer.
pub async fn served_after_a_dead_waiter(
    got: distlock::Result<distlock::LockGuard>,
    died: Instant,
    expiry: Duration,
    slack: Duration,
    what: &str,
) {
    let waited = died.elapsed();
    let g = got.unwrap_or_else(|e| panic!("the lock, once the dead waiter's {what} is gone: {e}"));
    let slack = slack.max(scheduling_slack().await);
    let bound = expiry + 2 * slack;
    assert!(
        waited < bound,
        "the next waiter got the lock {waited:?} after the waiter died (bound {bound:?})"
    );
    g.release().await.unwrap();
}

/// Does `fault` (a server killed, a network cut) to `guard`'s hold, then waits, at most
/// `wait` plus the scheduling slack, for the guard to be told it lost the hold (`what` names
/// the failure otherwise), which must come by the end of its client-side lease: no later than
/// what was left of it at the fault, plus the slack.
///
/// # Panics
/// When the guard is not told, or told later.
pub async fn told_by_the_lease_end(
    guard: &distlock::LockGuard,
    fault: impl FnOnce(),
    wait: Duration,
    what: &str,
) {
    let slack = scheduling_slack().await;
    let lease_left = guard.remaining();
    fault();
    let since = Instant::now();
    tokio::time::timeout(wait + slack, guard.lost())
        .await
        .unwrap_or_else(|_| panic!("{what}"));
    assert!(
        since.elapsed() <= lease_left + slack,
        "told after {:?} (lease left {lease_left:?}, slack {slack:?})",
        since.elapsed()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slack_is_at_least_the_base_and_bounded_on_a_live_runtime() {
        let slack = scheduling_slack().await;
        assert!(slack >= Duration::from_millis(300), "{slack:?}");
        // Twenty times a lateness of even a whole second would be absurd for 2 ms sleeps.
        assert!(slack < Duration::from_secs(20), "{slack:?}");
    }
}
