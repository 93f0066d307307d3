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
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::registry::{RegistryOptions, ThreadHold};

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
        Ok(Lock {
            lock: self.inner.obtain(key)?,
            rt: self.rt.clone(),
        })
    }

    /// See [`crate::LockRegistry::expire_unused_older_than`].
    pub fn expire_unused_older_than(&self, age: Duration) -> usize {
        self.inner.expire_unused_older_than(age)
    }

    /// The async registry underneath.
    pub fn as_async(&self) -> &crate::LockRegistry {
        &self.inner
    }
}

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

    fn acquire(&self, timeout: Option<Duration>) -> Result<bool> {
        let me = std::thread::current().id();
        {
            let mut re = self.lock.thread_hold();
            if let Some(r) = re.as_mut().filter(|r| r.thread == me) {
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
        *self.lock.thread_hold() = Some(ThreadHold {
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
            let mut re = self.lock.thread_hold();
            match re.as_mut() {
                Some(r) if r.thread == me => {
                    r.count -= 1;
                    if r.count > 0 {
                        return Ok(());
                    }
                    re.take().map(|r| r.guard)
                }
                _ => None,
            }
        };
        match guard {
            Some(g) => wait(&self.rt, g.release()),
            None => Err(Error::NotHeld {
                key: self.lock.key().to_owned(),
            }),
        }
    }

    /// Whether the calling thread holds the lock (and it is not lost).
    pub fn is_held_by_current_thread(&self) -> bool {
        let me = std::thread::current().id();
        self.lock
            .thread_hold()
            .as_ref()
            .is_some_and(|r| r.thread == me && r.guard.is_held())
    }

    /// How often the calling thread has locked without unlocking (0 when it does not hold it).
    pub fn hold_count(&self) -> u32 {
        let me = std::thread::current().id();
        self.lock
            .thread_hold()
            .as_ref()
            .filter(|r| r.thread == me)
            .map_or(0, |r| r.count)
    }

    /// The fence of the current hold, when the calling thread holds the lock.
    pub fn fence(&self) -> Option<u64> {
        let me = std::thread::current().id();
        self.lock
            .thread_hold()
            .as_ref()
            .filter(|r| r.thread == me)
            .map(|r| r.guard.fence())
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.lock.key()
    }
}
