//! A synchronous facade for code without an async runtime, with Java-style reentrant
//! `lock()` / `unlock()` per thread.
//!
//! ```
//! use distlock::blocking::LockRegistry;
//! use distlock::backends::memory::MemoryBackend;
//!
//! let registry = LockRegistry::new(MemoryBackend::new())?;
//! let lock = registry.obtain("nightly-job")?;
//! lock.lock()?;
//! lock.lock()?; // reentrant: the same thread may lock again...
//! assert_eq!(lock.hold_count(), 2);
//! lock.unlock()?;
//! lock.unlock()?; // ...and unlocks as often
//! assert!(!lock.is_held_by_current_thread());
//! # Ok::<(), distlock::Error>(())
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::options::RegistryOptions;

/// A [`crate::LockRegistry`] driven by its own small runtime (one worker thread that also runs
/// lease renewal), for synchronous code (threads of your own, or `spawn_blocking`); async code uses the
/// async API.
#[derive(Clone)]
pub struct LockRegistry {
    inner: crate::LockRegistry,
    rt: Arc<tokio::runtime::Runtime>,
}

impl fmt::Debug for LockRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LockRegistry")
            .field(&self.inner)
            .finish()
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("distlock-blocking")
        .enable_all()
        .build()
        .map_err(|e| Error::config(format!("cannot start the runtime: {e}")))
}

/// Runs `fut` on the facade's runtime and blocks the calling thread until it completes.
/// Works from any thread (also from `spawn_blocking`); on an async worker thread it would
/// stall that worker, so async code uses the async API instead.
fn wait<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().unwrap_or_else(|_| {
        Err(Error::Unsupported {
            backend: "blocking",
            what: "the runtime shut down".into(),
        })
    })
}

impl LockRegistry {
    /// A registry over `backend` with default options.
    pub fn new(backend: impl Backend) -> Result<Self> {
        Self::with_options(backend, RegistryOptions::default())
    }

    /// A registry over `backend` with `options`.
    pub fn with_options(backend: impl Backend, options: RegistryOptions) -> Result<Self> {
        let rt = runtime()?;
        let inner = {
            let _enter = rt.enter();
            crate::LockRegistry::with_options(backend, options)?
        };
        Ok(LockRegistry {
            inner,
            rt: Arc::new(rt),
        })
    }

    /// A registry over a shared backend.
    pub fn from_backend(backend: Arc<dyn Backend>, options: RegistryOptions) -> Result<Self> {
        let rt = runtime()?;
        let inner = {
            let _enter = rt.enter();
            crate::LockRegistry::from_backend(backend, options)?
        };
        Ok(LockRegistry {
            inner,
            rt: Arc::new(rt),
        })
    }

    /// Connects to the backend named by `url` (see [`crate::connect`]).
    pub fn connect(url: &str, options: RegistryOptions) -> Result<Self> {
        let rt = runtime()?;
        let url = url.to_owned();
        let inner = wait(&rt, async move {
            crate::LockRegistry::connect(&url, options).await
        })?;
        Ok(LockRegistry {
            inner,
            rt: Arc::new(rt),
        })
    }

    /// The lock for `key`.
    pub fn obtain(&self, key: &str) -> Result<Lock> {
        Ok(self.wrap(self.inner.obtain(key)?))
    }

    /// The read-write lock of `key` (see [`crate::LockRegistry::read_write`]).
    pub fn read_write(&self, key: &str) -> Result<ReadWriteLock> {
        let rw = self.inner.read_write(key)?;
        Ok(ReadWriteLock {
            read: self.wrap(rw.read().clone()),
            write: self.wrap(rw.write().clone()),
        })
    }

    /// The semaphore `key` with `permits` permits (see [`crate::LockRegistry::semaphore`]);
    /// each thread holds at most one permit of it, reentrantly.
    pub fn semaphore(&self, key: &str, permits: u32) -> Result<Lock> {
        Ok(self.wrap(self.inner.semaphore(key, permits)?))
    }

    /// A multi-key lock over the mutexes of `keys` (see [`crate::LockRegistry::multi`]).
    pub fn multi<K: AsRef<str>>(&self, keys: &[K]) -> Result<MultiLock> {
        Ok(MultiLock {
            lock: self.inner.multi(keys)?,
            rt: self.rt.clone(),
        })
    }

    fn wrap(&self, lock: crate::Lock) -> Lock {
        Lock {
            lock,
            rt: self.rt.clone(),
        }
    }

    /// See [`crate::LockRegistry::expire_unused_older_than`].
    pub fn expire_unused_older_than(&self, age: Duration) -> usize {
        self.inner.expire_unused_older_than(age)
    }

    /// Blocks, at most `timeout`, until the releases and queue exits left to background tasks
    /// (guards dropped without `unlock`, acquisitions that timed out) have reached the
    /// backend; true when none is left. See [`crate::LockRegistry::flush`]. The facade's
    /// runtime ends with its last handle and drops those tasks unfinished, so call this
    /// before dropping it when the process exits right after; dropping never waits.
    pub fn flush(&self, timeout: Duration) -> bool {
        let inner = self.inner.clone();
        wait(&self.rt, async move { Ok(inner.flush(timeout).await) }).unwrap_or(false)
    }

    /// The async registry underneath.
    pub fn as_async(&self) -> &crate::LockRegistry {
        &self.inner
    }
}

/// A hold taken by one thread (the blocking facade's reentrant lock): the owner thread, how
/// often it locked without unlocking, and the guard.
struct ThreadHold {
    thread: std::thread::ThreadId,
    count: u32,
    guard: LockGuard,
}

/// The thread holds of one key, kept with the key's local lock so that all handles share them.
type ThreadHolds = Mutex<Vec<ThreadHold>>;

/// A reentrant lock for synchronous code: the thread that holds it may lock it again and must
/// unlock it as often. Other threads wait (locally first, then remotely).
#[derive(Clone)]
pub struct Lock {
    lock: crate::Lock,
    rt: Arc<tokio::runtime::Runtime>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::Lock").field(&self.lock).finish()
    }
}

impl Lock {
    /// Blocks until this thread holds the lock (at once if it already does).
    pub fn lock(&self) -> Result<()> {
        self.acquire(None).map(|_| ())
    }

    /// Takes the lock if it is free now; `Ok(false)` when busy.
    pub fn try_lock(&self) -> Result<bool> {
        self.acquire(Some(Duration::ZERO))
    }

    /// Waits at most `timeout`; `Ok(false)` when the lock stayed busy.
    pub fn try_lock_for(&self, timeout: Duration) -> Result<bool> {
        self.acquire(Some(timeout))
    }

    /// The holds threads took through this facade, shared by all handles of the key.
    fn thread_holds(&self) -> MutexGuard<'_, Vec<ThreadHold>> {
        self.lock
            .slot
            .local()
            .thread_holds
            .get_or_init(|| Box::new(ThreadHolds::default()))
            .downcast_ref::<ThreadHolds>()
            .expect("only the blocking facade keeps thread holds")
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn acquire(&self, timeout: Option<Duration>) -> Result<bool> {
        let me = std::thread::current().id();
        {
            let mut holds = self.thread_holds();
            if let Some(r) = holds.iter_mut().find(|r| r.thread == me) {
                r.guard.ensure_held()?;
                r.count = r
                    .count
                    .checked_add(1)
                    .ok_or_else(|| Error::config("reentrant hold count overflow"))?;
                return Ok(true);
            }
        }
        let lock = self.lock.clone();
        let acquired = wait(&self.rt, async move {
            match timeout {
                None => lock.lock().await,
                Some(t) if t.is_zero() => lock.try_lock().await,
                Some(t) => lock.try_lock_for(t).await,
            }
        });
        let guard = match acquired {
            Ok(g) => g,
            Err(Error::NotAcquired { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        self.thread_holds().push(ThreadHold {
            thread: me,
            count: 1,
            guard,
        });
        Ok(true)
    }

    /// Undoes one `lock()` of this thread; the last one releases the lock. Fails with
    /// [`Error::NotHeld`] when this thread does not hold it and with [`Error::LockLost`] when it
    /// was lost meanwhile.
    pub fn unlock(&self) -> Result<()> {
        let me = std::thread::current().id();
        let guard = {
            let mut holds = self.thread_holds();
            match holds.iter().position(|r| r.thread == me) {
                Some(i) => {
                    holds[i].count -= 1;
                    if holds[i].count > 0 {
                        return Ok(());
                    }
                    Some(holds.swap_remove(i).guard)
                }
                None => None,
            }
        };
        match guard {
            Some(g) => wait(&self.rt, g.release()),
            None => Err(Error::NotHeld {
                key: self.lock.key().to_owned(),
            }),
        }
    }

    fn with_mine<T>(&self, f: impl FnOnce(&ThreadHold) -> T) -> Option<T> {
        let me = std::thread::current().id();
        self.thread_holds().iter().find(|r| r.thread == me).map(f)
    }

    /// Whether the calling thread holds the lock (and it is not lost).
    pub fn is_held_by_current_thread(&self) -> bool {
        self.with_mine(|r| r.guard.is_held()).unwrap_or(false)
    }

    /// How often the calling thread has locked without unlocking (0 when it does not hold it).
    pub fn hold_count(&self) -> u32 {
        self.with_mine(|r| r.count).unwrap_or(0)
    }

    /// The fence of the current hold, when the calling thread holds the lock.
    pub fn fence(&self) -> Option<u64> {
        self.with_mine(|r| r.guard.fence())
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.lock.key()
    }

    /// The kind of lock (see [`crate::Lock::kind`]).
    pub fn kind(&self) -> crate::LockKind {
        self.lock.kind()
    }
}

/// A read-write lock for synchronous code: each side is a [`Lock`], reentrant per thread.
/// Several threads (and processes) may hold the read side at once.
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    read: Lock,
    write: Lock,
}

impl ReadWriteLock {
    /// The shared side.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The exclusive side.
    pub fn write(&self) -> &Lock {
        &self.write
    }
}

/// A multi-key lock for synchronous code (see [`crate::MultiLock`]); it is not reentrant.
#[derive(Clone, Debug)]
pub struct MultiLock {
    lock: crate::MultiLock,
    rt: Arc<tokio::runtime::Runtime>,
}

impl MultiLock {
    /// Blocks until every lock is held.
    pub fn lock(&self) -> Result<MultiGuard> {
        self.acquire(None)
    }

    /// Takes every lock if each is free now, else fails with [`Error::NotAcquired`].
    pub fn try_lock(&self) -> Result<MultiGuard> {
        self.acquire(Some(Duration::ZERO))
    }

    /// Waits at most `timeout` for all the locks, else fails with [`Error::NotAcquired`].
    pub fn try_lock_for(&self, timeout: Duration) -> Result<MultiGuard> {
        self.acquire(Some(timeout))
    }

    fn acquire(&self, timeout: Option<Duration>) -> Result<MultiGuard> {
        let lock = self.lock.clone();
        let guard = wait(&self.rt, async move {
            match timeout {
                None => lock.lock().await,
                Some(t) => lock.try_lock_for(t).await,
            }
        })?;
        Ok(MultiGuard {
            guard: Some(guard),
            rt: self.rt.clone(),
        })
    }
}

/// Every lock of a [`MultiLock`], held. Dropping it releases them on the facade's runtime
/// without waiting; [`unlock`](Self::unlock) waits and reports.
#[must_use = "dropping the guard releases every lock at once"]
#[derive(Debug)]
pub struct MultiGuard {
    guard: Option<crate::MultiGuard>,
    rt: Arc<tokio::runtime::Runtime>,
}

impl MultiGuard {
    /// The held locks' guards (fences, lost state), in acquisition order.
    pub fn guards(&self) -> &[crate::LockGuard] {
        self.guard.as_ref().map_or(&[], |g| g.guards())
    }

    /// The fence of `key`'s hold.
    pub fn fence(&self, key: &str) -> Option<u64> {
        self.guard.as_ref()?.fence(key)
    }

    /// True while every lock is held.
    pub fn is_held(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.is_held())
    }

    /// Releases every lock and waits for it; the first error, if any.
    pub fn unlock(mut self) -> Result<()> {
        match self.guard.take() {
            Some(g) => wait(&self.rt, g.release()),
            None => Ok(()),
        }
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        // Dropped on the facade's runtime, each guard releases in a counted background task
        // that `LockRegistry::flush` waits for.
        let _rt = self.rt.enter();
        drop(self.guard.take());
    }
}
