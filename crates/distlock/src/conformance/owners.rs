//! Holder identity: every hold says who holds it, and `inspect` and `list` show it.

use std::time::Duration;

use super::{short_lease, within, Harness};
use crate::backend::{LockInfo, Owner};
use crate::LockRegistry;

async fn registry_as(h: &Harness, owner: &str) -> LockRegistry {
    h.registry_with(short_lease().with_owner(Owner::new(owner).unwrap()))
        .await
}

async fn owners_of(reg: &LockRegistry, key: &str) -> Vec<String> {
    let info: Option<LockInfo> = reg.obtain(key).unwrap().inspect().await.unwrap();
    info.map(|i| i.owners).unwrap_or_default()
}

/// Every hold carries its owner's description: one for a mutex, whoever took it last (also
/// through a hand-over to a waiter), one per reader and per permit holder; a lock handle may
/// name its own; `list` shows the same as `inspect`.
pub async fn owners_are_reported(h: &Harness) {
    let caps = h.backend().await.capabilities();
    let (a, b) = (
        registry_as(h, "conf-a:1").await,
        registry_as(h, "conf-b:2").await,
    );

    let held = a.obtain("o-mutex").unwrap().lock().await.unwrap();
    assert_eq!(owners_of(&b, "o-mutex").await, ["conf-a:1"], "mutex holder");
    // A waiter that gets the lock when it is released (a hand-over, where the backend has them).
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.obtain("o-mutex").unwrap().lock().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    let taken = within(
        h.limit(Duration::from_secs(5), 20).await,
        "the waiter's hold",
        waiter,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        owners_of(&a, "o-mutex").await,
        ["conf-b:2"],
        "after the hand-over"
    );

    let job = Owner::new("nightly-report").unwrap();
    let named = a.obtain("o-job").unwrap().with_owner(job);
    assert_eq!(named.owner().as_str(), "nightly-report");
    let job_guard = named.lock().await.unwrap();
    assert_eq!(
        owners_of(&b, "o-job").await,
        ["nightly-report"],
        "a lock's own owner"
    );

    let mut shared = Vec::new();
    if caps.read_write {
        shared.push(a.read_write("o-read").unwrap().read().lock().await.unwrap());
        shared.push(b.read_write("o-read").unwrap().read().lock().await.unwrap());
        assert_eq!(
            owners_of(&a, "o-read").await,
            ["conf-a:1", "conf-b:2"],
            "readers"
        );
    }
    if caps.semaphores {
        shared.push(a.semaphore("o-sem", 3).unwrap().lock().await.unwrap());
        shared.push(b.semaphore("o-sem", 3).unwrap().lock().await.unwrap());
        assert_eq!(
            owners_of(&b, "o-sem").await,
            ["conf-a:1", "conf-b:2"],
            "permits"
        );
    }

    let listed = a.backend().list(h.prefix()).await.expect("list");
    assert!(!listed.is_empty(), "nothing listed");
    for l in &listed {
        let inspected = owners_of(&a, &l.key).await;
        let mut got = l.info.owners.clone();
        got.sort();
        assert_eq!(got, inspected, "{}: list and inspect disagree", l.key);
    }

    taken.release().await.unwrap();
    job_guard.release().await.unwrap();
    for g in shared {
        g.release().await.unwrap();
    }
    assert!(
        owners_of(&a, "o-mutex").await.is_empty(),
        "a released lock still has owners"
    );
}
