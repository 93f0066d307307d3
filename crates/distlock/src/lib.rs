//! Distributed locks for Rust services: mutual exclusion across tasks, processes and machines,
//! with leases, automatic renewal, fencing tokens and lost-lock notification.
//!
//! One API ([`LockRegistry`], [`Lock`], [`LockGuard`]) runs over interchangeable coordination
//! engines ([`Backend`]): an in-process table, Redis, a lease table in SQLite, PostgreSQL or
//! MySQL/MariaDB, ZooKeeper, or etcd. The layouts are those of the established clients (Spring
//! Integration's `RedisLockRegistry` and `JdbcLockRegistry`, Curator's `InterProcessMutex`,
//! etcd's `concurrency.Mutex`), so Rust, Java and Go services can share locks.
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use distlock::{Error, LockRegistry, RegistryOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> distlock::Result<()> {
//! // One registry per service instance. `memory://` keeps this example in-process; use
//! // `redis://host:6379` or `sqlite:///var/lib/app/locks.db` to lock across processes.
//! let registry = LockRegistry::connect("memory://", RegistryOptions::default()).await?;
//! let lock = registry.obtain("voucher:42")?;
//!
//! match lock.try_lock().await {
//!     Ok(guard) => {
//!         // Pass the fence with every write the lock protects; the storage refuses writes
//!         // whose fence is lower than one it has already accepted.
//!         let fence = guard.fence();
//!         tokio::select! {
//!             _ = guard.lost() => eprintln!("lock lost: stop before writing with fence {fence}"),
//!             _ = tokio::time::sleep(Duration::from_millis(10)) => println!("processed, fence {fence}"),
//!         }
//!         guard.release().await?;
//!     }
//!     Err(Error::NotAcquired { .. }) => println!("voucher 42 is already being processed"),
//!     Err(e) => return Err(e),
//! }
//!
//! // Waiting: without limit, or bounded.
//! let guard = lock.try_lock_for(Duration::from_secs(5)).await?;
//! assert!(guard.is_held());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Code without an async runtime uses the [`blocking`] facade, whose locks are reentrant per
//! thread like Java's `ReentrantLock`.
//!
//! # Lock kinds
//!
//! Besides the mutex of [`LockRegistry::obtain`], a registry hands out three more kinds, each a
//! [`Lock`] (or [`MultiLock`]) with the same `lock`, `try_lock` and `try_lock_for`, lease and
//! renewal, lost signal, fences and cancel safety:
//!
//! - [`LockRegistry::read_write`]: a read-write lock. Its [`read`](ReadWriteLock::read) side
//!   is shared with other readers, its [`write`](ReadWriteLock::write) side is exclusive, and a
//!   writer that waits keeps new readers out. Both exclude the key's mutex, as `flock -s` and
//!   `flock -x` do.
//! - [`LockRegistry::semaphore`]: at most N holders of a key at once, each permit with a lease,
//!   owner token and renewal of its own.
//! - [`LockRegistry::multi`] and [`MultiLock::new`]: several locks held together, all or
//!   nothing, taken in key order so that multi-key holders cannot deadlock.
//!
//! Fences increase per key across every kind. A backend states which kinds it takes in its
//! [`Capabilities`] (`read_write`, `semaphores`); every built-in backend takes them all.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> distlock::Result<()> {
//! # let registry = distlock::LockRegistry::connect("memory://", Default::default()).await?;
//! let report = registry.read_write("report:2026")?;
//! let reading = report.read().lock().await?; // beside other readers
//! assert!(report.write().try_lock().await.is_err()); // no writer while anyone reads
//! reading.release().await?;
//!
//! let exports = registry.semaphore("exports", 4)?; // four at a time
//! let permit = exports.lock().await?;
//! permit.release().await?;
//!
//! let transfer = registry.multi(&["account:1", "account:2"])?.lock().await?;
//! transfer.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `memory` | yes | [`backends::memory`]: locks within one process (`memory://`) |
//! | `redis` | yes | [`backends::redis`]: one Redis server, Spring `RedisLockRegistry` layout (`redis://`, `rediss://`) |
//! | `sqlite` | yes | [`backends::sqlite`]: a lease table in a SQLite file shared by the processes of one machine (`sqlite:///abs/path.db`) |
//! | `postgres` | no | `backends::postgres`: a lease table in PostgreSQL, waiters woken by `LISTEN`/`NOTIFY` (`postgres://`) |
//! | `mysql` | no | `backends::mysql`: a lease table in MySQL or MariaDB, waiters poll with jitter (`mysql://`) |
//! | `zookeeper` | no | `backends::zookeeper`: Curator `InterProcessMutex` layout on ZooKeeper, FIFO (`zk://`) |
//! | `zookeeper-tls` | no | TLS for the ZooKeeper backend (`zks://`), with client certificates |
//! | `etcd` | no | `backends::etcd`: etcd `concurrency.Mutex` layout (`etcdctl lock` compatible), FIFO (`etcd://`) |
//! | `etcd-tls` | no | TLS for the etcd backend (`etcds://`) |
//! | `metrics` | no | counters and histograms through the `metrics` facade |
//!
//! [`connect`] turns a URL into a backend; it lists the schemes this build understands in
//! [`SCHEMES`].
//!
//! # Guarantees and their limits
//!
//! - **Mutual exclusion with a lease.** A remote hold lasts for a lease (default 30 s,
//!   [`RegistryOptions::lease`]); while the [`LockGuard`] lives, one renewal task per registry
//!   extends it at about a third of the lease ([`RegistryOptions::renew`]). A holder that cannot
//!   renew before its lease ends (cut off, stalled) loses the lock: [`LockGuard::is_held`]
//!   turns false, [`LockGuard::lost`] completes, and every operation on the guard returns
//!   [`Error::LockLost`].
//! - **Fencing.** A paused process cannot be stopped from acting after its lease ran out;
//!   [`LockGuard::fence`] is what protects the data then. Fences strictly increase per key
//!   (the backend's fence shifted left by 10 bits, plus a local handoff number), so storage that
//!   rejects writes with a fence lower than the last one accepted stops the stale holder. How far
//!   a backend's fences can be trusted is stated by [`Capabilities::fencing`] ([`Fencing`]).
//! - **Owner-checked release.** Every acquisition has a fresh 128-bit [`Token`]; release and
//!   extension are atomic on the server and only succeed for that token.
//! - **Local lock first.** Within one registry only one task at a time contends remotely for a
//!   key; the others wait in FIFO order, and the remote hold may pass straight to the next of
//!   them up to [`RegistryOptions::max_local_handoffs`] times in a row.
//! - **Cancel safety.** [`Lock::lock`], [`Lock::try_lock`] and [`Lock::try_lock_for`] may be
//!   dropped at any point without leaving a lock held or a waiter queued.
//! - **Drop never blocks.** Dropping a guard hands the hold to a local waiter or releases it in
//!   the background when a Tokio runtime is running; otherwise the lease expires. Prefer
//!   [`LockGuard::release`], which reports whether the lock was still held.
//! - **Reentrancy.** The async API is not reentrant: locking a key whose guard the same task
//!   holds waits for itself. [`blocking::Lock`] is reentrant per thread.
//!
//! The full contract, with what each backend keeps, its limits and what is not done yet, is
//! `docs/GUARANTEES.md` in the repository.
#![warn(missing_docs, unreachable_pub, rustdoc::broken_intra_doc_links)]
// On by default; named because `rust-version` is only checked this way (scripts/test.sh): it
// rejects standard-library items newer than the version users are promised.
#![warn(clippy::incompatible_msrv)]
// docs.rs builds with `--cfg docsrs` on nightly (see `[package.metadata.docs.rs]`), so that each
// item behind a cargo feature carries that feature's badge; stable builds never see this.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The core, each module above those it uses: error, backend, renewal, options, background,
// state (what one registry shares), guard, lock (handles and the acquisition path), multi,
// election, registry (the facade), connect (every scheme), blocking.
mod backend;
mod background;
pub mod blocking;
mod connect;
pub mod duration;
mod election;
mod error;
mod guard;
mod lock;
mod metrics;
mod multi;
mod options;
mod registry;
mod renewal;
mod state;
#[cfg(any(feature = "zookeeper-tls", feature = "redis", feature = "postgres"))]
mod tls;
mod url;

pub use backend::*;
pub use connect::{connect, SCHEMES};
pub use election::{Election, Leader, Leadership, OBSERVE_EVERY};
pub use error::{Error, Result, ShortKey};
pub use guard::LockGuard;
pub use lock::{Lock, ReadWriteLock};
pub use multi::{MultiGuard, MultiLock};
pub use options::{RegistryOptions, MAX_LEASE, MIN_LEASE};
pub use registry::LockRegistry;
pub use url::redact;

/// The backends, one module each behind a cargo feature.
pub mod backends {
    #[cfg(any(feature = "zookeeper", feature = "etcd"))]
    pub(crate) mod contenders;
    #[cfg(feature = "etcd")]
    pub mod etcd;
    #[cfg(feature = "memory")]
    pub mod memory;
    #[cfg(feature = "redis")]
    pub mod redis;
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub mod sql;
    #[cfg(feature = "zookeeper")]
    pub mod zookeeper;
    #[cfg(feature = "mysql")]
    pub use sql::mysql;
    #[cfg(feature = "postgres")]
    pub use sql::postgres;
    #[cfg(feature = "sqlite")]
    pub use sql::sqlite;
}
