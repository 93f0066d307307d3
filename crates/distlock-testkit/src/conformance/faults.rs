//! A scenario over a network that loses or delays acquisition replies.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{within, Harness};
use crate::hooked::{Hooked, Hooks};
use distlock::Error;
use distlock::{AcquireRequest, Attempt, Backend};
use distlock::{LockRegistry, RegistryOptions};

/// What [`ReplyFaults`] does to an acquisition attempt.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ReplyFault {
    None,
    /// The attempt reaches the server, its reply is lost: it fails as a broken connection would.
    Lose,
    /// The attempt takes this long to reach the server and its reply as long to come back. As
    /// on a network, dropping the caller's future does not stop a request already sent.
    Delay(Duration),
}

/// Acquisition attempts over a network that loses or delays replies.
#[derive(Debug)]
struct ReplyFaults {
    fault: Mutex<ReplyFault>,
}

impl ReplyFaults {
    fn set(&self, fault: ReplyFault) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }
}

#[async_trait::async_trait]
impl Hooks for ReplyFaults {
    async fn acquire(
        &self,
        inner: &Arc<dyn Backend>,
        request: &AcquireRequest,
    ) -> distlock::Result<Attempt> {
        let fault = *self.fault.lock().unwrap_or_else(|e| e.into_inner());
        let (inner, request) = (inner.clone(), request.clone());
        let delay = match fault {
            ReplyFault::Delay(d) => d,
            _ => Duration::ZERO,
        };
        // The request is on its way: it arrives whatever happens to the caller.
        let request = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            inner.acquire(&request).await
        });
        let outcome = request.await.unwrap_or_else(|e| {
            Err(Error::Backend {
                backend: "faults",
                message: e.to_string(),
            })
        });
        tokio::time::sleep(delay).await;
        if fault == ReplyFault::Lose {
            return Err(Error::Unavailable {
                backend: "faults",
                message: "connection reset before the reply".to_owned(),
            });
        }
        outcome
    }
}

/// An acquisition that returns no guard leaves the lock free, also when the server granted an
/// attempt whose reply was lost, came after `try_lock_for`'s deadline, or was still on its way
/// to the server when the future was dropped (the undo must not overtake it). The lease is a
/// minute, so expiry cannot pass for a release.
pub async fn failed_acquisitions_leave_the_lock_free(h: &Harness) {
    let long = Duration::from_secs(60);
    let faulty = Arc::new(Hooked::wrap(
        h.backend().await,
        ReplyFaults {
            fault: Mutex::new(ReplyFault::None),
        },
    ));
    let reg = LockRegistry::from_backend(
        faulty.clone(),
        RegistryOptions::default()
            .with_prefix(h.prefix())
            .with_lease(long),
    )
    .expect("valid options");
    let other = h
        .registry_with(RegistryOptions::default().with_lease(long))
        .await;
    let free_for_other = |what: &'static str| {
        let lock = other.obtain("f").unwrap();
        async move {
            let g = within(
                Duration::from_secs(6),
                what,
                lock.try_lock_for(Duration::from_secs(5)),
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: the lock stayed held ({e})"));
            g.release().await.unwrap();
        }
    };

    faulty.set(ReplyFault::Lose);
    assert!(reg.obtain("f").unwrap().try_lock().await.is_err());
    free_for_other("after try_lock lost its reply").await;
    let r = reg
        .obtain("f")
        .unwrap()
        .try_lock_for(Duration::from_millis(300))
        .await;
    assert!(r.is_err(), "every reply was lost, yet acquired");
    free_for_other("after try_lock_for lost every reply").await;

    let late = Duration::from_millis(800);
    faulty.set(ReplyFault::Delay(late));
    let started = Instant::now();
    let r = reg
        .obtain("f")
        .unwrap()
        .try_lock_for(Duration::from_millis(150))
        .await;
    assert!(
        matches!(r, Err(Error::NotAcquired { .. })),
        "the reply came after the deadline: {r:?}"
    );
    assert!(
        started.elapsed() < late,
        "try_lock_for waited {:?} for a reply past its deadline",
        started.elapsed()
    );
    free_for_other("after try_lock_for's deadline passed with the reply in flight").await;

    let r = tokio::time::timeout(Duration::from_millis(150), reg.obtain("f").unwrap().lock()).await;
    assert!(r.is_err(), "lock() returned although its reply was late");
    // Look only once the request has surely reached the server: a release sent at the
    // cancellation would have come before it, and freed nothing.
    tokio::time::sleep(late + late / 2).await;
    free_for_other("after lock() was cancelled with the request on its way").await;

    faulty.set(ReplyFault::None);
    let g = within(
        Duration::from_secs(6),
        "the faulty registry after the faults",
        reg.obtain("f")
            .unwrap()
            .try_lock_for(Duration::from_secs(5)),
    )
    .await
    .expect("the lock is free again");
    g.release().await.unwrap();
}
