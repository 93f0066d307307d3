//! The registry's in-process paths on the memory backend: what distlock itself costs on top of a
//! backend round trip. Every case runs on a current-thread Tokio runtime.
//!
//! ```text
//! cargo bench -p distlock --bench registry              # about 30 s
//! cargo bench -p distlock --bench registry -- --quick   # a few seconds, rougher figures
//! ```

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use distlock::backends::memory::MemoryBackend;
use distlock::{
    AcquireRequest, Backend, Lock, LockName, LockRegistry, RegistryOptions, Renewal, Token,
};
use tokio::runtime::Runtime;

const MANY_KEYS: usize = 1000;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

fn registry() -> LockRegistry {
    LockRegistry::new(MemoryBackend::new())
}

/// `lock()` then `release()` on a free key: local lock, remote acquire, renewal registration,
/// remote release.
fn uncontended_lock_release(c: &mut Criterion) {
    let rt = runtime();
    let lock = registry().obtain("voucher:42").unwrap();
    c.bench_function("uncontended_lock_release", |b| {
        b.to_async(&rt).iter(|| async {
            let guard = lock.lock().await.unwrap();
            guard.release().await.unwrap();
        })
    });
}

/// `try_lock()` on a key that is held: by the same registry (fails on the local lock) and by
/// another registry (fails at the backend).
fn try_lock_held(c: &mut Criterion) {
    let rt = runtime();
    let backend = std::sync::Arc::new(MemoryBackend::new());
    let holder = LockRegistry::from_backend(backend.clone(), Default::default()).unwrap();
    let other = LockRegistry::from_backend(backend, Default::default()).unwrap();
    let guard = rt
        .block_on(holder.obtain("voucher:42").unwrap().lock())
        .unwrap();
    let mut group = c.benchmark_group("try_lock_held");
    for (name, registry) in [("same_registry", &holder), ("other_registry", &other)] {
        let lock = registry.obtain("voucher:42").unwrap();
        group.bench_function(name, |b| {
            b.to_async(&rt)
                .iter(|| async { assert!(lock.try_lock().await.is_err()) })
        });
    }
    group.finish();
    rt.block_on(guard.release()).unwrap();
}

/// Two tasks of one registry take turns on one key, each holding it across a yield so the other
/// is always queued: the hold passes between them locally (lock cohorting), with a remote
/// release and re-acquire every `max_local_handoffs` (default 32) turns. Time per turn.
fn local_handoff(c: &mut Criterion) {
    async fn turns(lock: Lock, n: u64) {
        for _ in 0..n {
            let guard = lock.lock().await.unwrap();
            tokio::task::yield_now().await;
            guard.release().await.unwrap();
        }
    }
    let rt = runtime();
    let lock = registry().obtain("voucher:42").unwrap();
    c.bench_function("local_handoff_two_tasks", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let lock = lock.clone();
            async move {
                let started = Instant::now();
                let first = tokio::spawn(turns(lock.clone(), iters - iters / 2));
                let second = tokio::spawn(turns(lock, iters / 2));
                first.await.unwrap();
                second.await.unwrap();
                started.elapsed()
            }
        })
    });
}

/// `obtain()` of a key whose handle is already cached.
fn obtain_cached(c: &mut Criterion) {
    let registry = registry();
    drop(registry.obtain("voucher:42").unwrap());
    c.bench_function("obtain_cached", |b| {
        b.iter(|| registry.obtain("voucher:42").unwrap())
    });
}

/// `obtain()` of a key the registry has not seen: a new handle and its cache entry. The cache
/// is sized so that no eviction pass runs while measuring.
fn obtain_new(c: &mut Criterion) {
    let registry = LockRegistry::with_options(
        MemoryBackend::new(),
        RegistryOptions::default().with_max_cached_locks(usize::MAX),
    )
    .unwrap();
    let mut next = 0u64;
    let mut kept = Vec::new();
    c.bench_function("obtain_new", |b| {
        b.iter(|| {
            next += 1;
            kept.push(registry.obtain(&format!("voucher:{next}")).unwrap());
        })
    });
}

/// Dropping a guard: renewal stops at once, the remote release runs as a background task
/// (measured up to the spawn; the runtime runs the release before the next lock).
fn guard_drop(c: &mut Criterion) {
    let rt = runtime();
    let lock = registry().obtain("voucher:42").unwrap();
    c.bench_function("guard_drop", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let lock = lock.clone();
            async move {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let guard = lock.lock().await.unwrap();
                    let started = Instant::now();
                    drop(guard);
                    spent += started.elapsed();
                }
                spent
            }
        })
    });
}

/// One renewal batch of 1000 held keys as the renewal task sends it, through
/// `Backend::extend_many` (the registry's pass around it is internal).
fn renewal_batch(c: &mut Criterion) {
    let rt = runtime();
    let backend = MemoryBackend::new();
    let lease = Duration::from_secs(30);
    let batch: Vec<Renewal> = (0..MANY_KEYS)
        .map(|i| {
            let name = LockName::new("lock", &format!("voucher:{i}")).unwrap();
            let token = Token::random();
            let attempt =
                rt.block_on(backend.acquire(&AcquireRequest::new(name.clone(), token, lease)));
            assert!(matches!(attempt, Ok(distlock::Attempt::Acquired { .. })));
            Renewal { name, token, lease }
        })
        .collect();
    let mut group = c.benchmark_group("renewal_batch");
    group.throughput(Throughput::Elements(MANY_KEYS as u64));
    group.bench_function("extend_many_1000", |b| {
        b.to_async(&rt).iter(|| async {
            let results = backend.extend_many(&batch).await;
            assert!(results.iter().all(|r| matches!(r, Ok(true))));
        })
    });
    group.finish();
}

/// 1000 distinct keys acquired (all held at once), then all released.
fn many_keys(c: &mut Criterion) {
    let rt = runtime();
    let registry = registry();
    let locks: Vec<Lock> = (0..MANY_KEYS)
        .map(|i| registry.obtain(&format!("voucher:{i}")).unwrap())
        .collect();
    let mut group = c.benchmark_group("many_keys");
    group.throughput(Throughput::Elements(MANY_KEYS as u64));
    group.bench_function("acquire_release_1000", |b| {
        b.to_async(&rt).iter_batched(
            || Vec::with_capacity(MANY_KEYS),
            |mut guards| async {
                for lock in &locks {
                    guards.push(lock.try_lock().await.unwrap());
                }
                for guard in guards {
                    guard.release().await.unwrap();
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = uncontended_lock_release, try_lock_held, local_handoff, obtain_cached, obtain_new,
        guard_drop, renewal_batch, many_keys
}
criterion_main!(benches);
