//! What the registry gives back in the background (an abandoned attempt's hold, a wait-queue
//! place, a dropped guard's hold) reaches the backend before the process ends when it calls
//! `LockRegistry::flush`: each test ends its runtime right after, as a process returning from
//! `main` does, and then looks at the key from another runtime.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::backends::memory::MemoryBackend;
use distlock::{AcquireRequest, Attempt, Backend, LockInfo, LockRegistry, RegistryOptions};
use tokio::sync::{watch, Notify};

use distlock_testkit::hooked::{Hooked, Hooks};

/// Acquisition replies that wait for `gate` whenever the attempt changed the server (took the
/// lock or joined its queue); `arrived` fires once it did.
#[derive(Debug)]
struct Gate {
    arrived: Notify,
    gate: watch::Sender<bool>,
}

type Gated = Hooked<Gate>;

/// Memory locks behind a closed [`Gate`].
fn gated(inner: Arc<MemoryBackend>) -> Arc<Gated> {
    Arc::new(Hooked::wrap(
        inner,
        Gate {
            arrived: Notify::new(),
            gate: watch::channel(false).0,
        },
    ))
}

#[async_trait]
impl Hooks for Gate {
    async fn acquire(
        &self,
        inner: &Arc<dyn Backend>,
        request: &AcquireRequest,
    ) -> distlock::Result<Attempt> {
        let mut open = self.gate.subscribe();
        let a = inner.acquire(request).await;
        if request.queued() || matches!(a, Ok(Attempt::Acquired { .. })) {
            self.arrived.notify_one();
            let _ = open.wait_for(|o| *o).await;
        }
        a
    }
}

/// Ample: `flush` returns as soon as the work is done; only a hang would use it up.
const FLUSH: Duration = Duration::from_secs(60);
/// Far longer than any test: a key still held afterwards was left to its lease.
const LEASE: Duration = Duration::from_secs(600);

fn registry(backend: Arc<dyn Backend>) -> LockRegistry {
    LockRegistry::from_backend(backend, RegistryOptions::default().with_lease(LEASE)).unwrap()
}

/// Runs `f` on a runtime of its own and ends that runtime as soon as `f` returns, as a
/// process ends after `main`: background tasks still running are dropped.
fn in_a_process<T>(f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(f);
    drop(rt);
    out
}

/// The key as another process sees it afterwards.
fn inspect(mem: &Arc<MemoryBackend>, key: &str) -> Option<LockInfo> {
    let mem = mem.clone();
    in_a_process(async move { registry(mem).obtain(key).unwrap().inspect().await.unwrap() })
}

/// Acquires `key` through `gated` until the attempt reached the server, then abandons the
/// acquisition (its reply still held back) and lets the reply go.
async fn abandon_in_flight(gated: &Arc<Gated>, reg: &LockRegistry, key: &str) {
    let lock = reg.obtain(key).unwrap();
    tokio::select! {
        r = lock.lock() => panic!("the reply was held back, yet the acquisition ended: {r:?}"),
        () = gated.arrived.notified() => {}
    }
    gated.gate.send_replace(true);
}

#[test]
fn an_attempt_abandoned_in_flight_is_released_before_the_process_ends() {
    let mem = Arc::new(MemoryBackend::new());
    let gated = gated(mem.clone());
    let flushed = in_a_process({
        let gated = gated.clone();
        async move {
            let reg = registry(gated.clone());
            abandon_in_flight(&gated, &reg, "job").await;
            reg.flush(FLUSH).await
        }
    });
    assert!(flushed, "flush timed out");
    assert!(
        inspect(&mem, "job").is_none(),
        "the abandoned attempt's hold outlived the process: {:?}",
        inspect(&mem, "job")
    );
}

#[test]
fn a_waiter_abandoned_in_flight_leaves_the_queue_before_the_process_ends() {
    let mem = Arc::new(MemoryBackend::new());
    let gated = gated(mem.clone());
    let (holder, flushed) = in_a_process({
        let (gated, mem) = (gated.clone(), mem.clone());
        async move {
            let holder = registry(mem).obtain("job").unwrap().lock().await.unwrap();
            let reg = registry(gated.clone());
            abandon_in_flight(&gated, &reg, "job").await;
            (holder, reg.flush(FLUSH).await)
        }
    });
    assert!(flushed, "flush timed out");
    let info = inspect(&mem, "job").expect("the holder still holds the key");
    assert_eq!(info.holders, Some(1), "{info:?}");
    assert_eq!(
        info.waiters,
        Some(0),
        "the abandoned waiter is still queued: {info:?}"
    );
    // Its runtime is gone: dropping the holder's guard now releases nothing.
    drop(holder);
}

#[test]
fn a_dropped_guard_is_released_before_the_process_ends() {
    let mem = Arc::new(MemoryBackend::new());
    let flushed = in_a_process({
        let mem = mem.clone();
        async move {
            let reg = registry(mem);
            drop(reg.obtain("job").unwrap().lock().await.unwrap());
            reg.flush(FLUSH).await
        }
    });
    assert!(flushed, "flush timed out");
    assert!(inspect(&mem, "job").is_none(), "{:?}", inspect(&mem, "job"));
}

#[test]
fn flush_reports_work_it_did_not_see_finish() {
    let mem = Arc::new(MemoryBackend::new());
    let gated = gated(mem.clone());
    in_a_process(async move {
        let reg = registry(gated.clone());
        let lock = reg.obtain("job").unwrap();
        tokio::select! {
            r = lock.lock() => panic!("the reply was held back, yet the acquisition ended: {r:?}"),
            () = gated.arrived.notified() => {}
        }
        // The abandoned attempt's reply is still held back, so its undo cannot finish.
        assert!(!reg.flush(Duration::from_millis(10)).await);
        gated.gate.send_replace(true);
        assert!(reg.flush(FLUSH).await);
        assert!(lock.inspect().await.unwrap().is_none());
    });
}

#[test]
fn the_blocking_facade_flushes_dropped_multi_guards() {
    let mem = Arc::new(MemoryBackend::new());
    let reg = distlock::blocking::LockRegistry::from_backend(
        mem.clone(),
        RegistryOptions::default().with_lease(LEASE),
    )
    .unwrap();
    drop(reg.multi(&["a", "b"]).unwrap().lock().unwrap());
    assert!(reg.flush(FLUSH));
    drop(reg);
    assert!(inspect(&mem, "a").is_none() && inspect(&mem, "b").is_none());
}
