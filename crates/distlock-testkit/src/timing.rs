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
