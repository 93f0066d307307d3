//! Leader elections: one leader at a time, rising terms, every change observed in order, and a
//! dead leader replaced within its lease.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use super::{short_lease, within, Harness};
use distlock::Leader;
use distlock::Owner;

/// Three candidates lead twice each, one at a time; `leader()` names whoever leads with a term
/// at least its own; terms rise; and an observer sees every leadership, in order (each leader
/// stays until the observer has seen it, so the check does not race the clock).
pub async fn election_has_one_leader_at_a_time(h: &Harness) {
    const CANDIDATES: usize = 3;
    const TERMS: usize = 2;
    let fences = h.capabilities().await.fences();
    let limit = h.limit(Duration::from_secs(10), 50).await;
    let watcher = h.registry().await.election("e").unwrap();
    let seen: Arc<Mutex<Vec<Leader>>> = Arc::default();
    let observer = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut changes = Box::pin(watcher.observe_every(Duration::from_millis(20)));
            while let Some(change) = changes.next().await {
                if let Ok(Some(leader)) = change {
                    seen.lock().unwrap().push(leader);
                }
            }
        })
    };
    let leading = Arc::new(AtomicU32::new(0));
    let led: Arc<Mutex<Vec<Leader>>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..CANDIDATES {
        let reg = h.registry_with(short_lease()).await;
        let (leading, led, seen) = (leading.clone(), led.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            let election = reg.election("e").unwrap();
            let me = Owner::new(format!("candidate-{c}")).unwrap();
            for _ in 0..TERMS {
                let leadership = election.campaign(me.clone()).await.unwrap();
                assert_eq!(
                    leading.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two leaders at once"
                );
                let term = leadership.term();
                let now = election.leader().await.unwrap().expect("a leader");
                assert_eq!(now.description, me.as_str(), "leader() names the leader");
                assert!(
                    backend_fence(now.term) >= backend_fence(term),
                    "leader() term {} below {term}",
                    now.term
                );
                led.lock().unwrap().push(Leader {
                    description: me.to_string(),
                    term,
                });
                let observed = within(limit, "the observer to see the leader", async {
                    while !seen.lock().unwrap().iter().any(|l| {
                        l.description == me.as_str() && backend_fence(l.term) >= backend_fence(term)
                    }) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                });
                observed.await;
                assert!(leadership.is_leading());
                leading.fetch_sub(1, Ordering::SeqCst);
                leadership.resign().await.unwrap();
            }
        }));
    }
    within(limit * 6, "every candidate's terms", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    observer.abort();
    let led = led.lock().unwrap().clone();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(led.len(), CANDIDATES * TERMS);
    if fences {
        for pair in led.windows(2) {
            assert!(pair[1].term > pair[0].term, "terms must rise: {led:?}");
        }
        for pair in seen.windows(2) {
            assert!(
                pair[1].term > pair[0].term,
                "observed out of order: {seen:?}"
            );
        }
    }
    for l in &led {
        assert!(
            seen.iter().any(|s| s.description == l.description),
            "{l:?} never observed: {seen:?}"
        );
    }
}

/// The low bits of a fence that number local hand-overs: the crate's documented fence layout
/// (the backend's fence shifted left by 10 bits).
const LOCAL_SEQ_BITS: u32 = 10;

/// The backend's part of a term (the local hand-over bits dropped).
fn backend_fence(term: u64) -> u64 {
    term >> LOCAL_SEQ_BITS
}

/// A leader that stops renewing (a dead process) is replaced within its lease, by a standby
/// that waited for it, with a higher term.
pub async fn dead_leader_is_replaced_within_its_lease(h: &Harness) {
    let lease = Duration::from_millis(300);
    let dead = h.unrenewed_registry(lease).await;
    let standby = h.registry().await;
    let first = dead
        .election("e")
        .unwrap()
        .campaign(Owner::new("dying").unwrap())
        .await
        .unwrap();
    let started = Instant::now();
    let next = standby
        .election("e")
        .unwrap()
        .campaign_for(
            Owner::new("standby").unwrap(),
            h.limit(Duration::from_secs(3), 20).await,
        )
        .await
        .expect("the standby leads once the dead leader's lease ends");
    assert!(
        started.elapsed() >= lease * 2 / 3,
        "the standby led before the lease ended"
    );
    assert!(!first.is_leading());
    if h.capabilities().await.fences() {
        assert!(next.term() > first.term());
    }
    let leader = standby
        .election("e")
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap();
    if h.capabilities().await.owners {
        assert_eq!(leader.description, "standby");
    }
    next.resign().await.unwrap();
    assert!(standby
        .election("e")
        .unwrap()
        .leader()
        .await
        .unwrap()
        .is_none());
}
