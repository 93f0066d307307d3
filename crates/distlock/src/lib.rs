//! distlock: distributed locks for Rust services.
#![warn(missing_docs, unreachable_pub, rustdoc::broken_intra_doc_links)]

mod backend;
pub mod blocking;
mod error;
mod guard;
mod registry;
mod renewal;
mod url;

pub use backend::*;
pub use error::{Error, Result};
#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "testkit")]
pub mod testkit;
pub use guard::LockGuard;
pub use registry::{Lock, LockRegistry, RegistryOptions, MAX_LEASE, MIN_LEASE};
pub use url::{connect, redact, SCHEMES};

/// The backends, one module each behind a cargo feature.
pub mod backends {
    #[cfg(feature = "memory")]
    pub mod memory;
    #[cfg(feature = "redis")]
    pub mod redis;
    #[cfg(feature = "sqlite")]
    pub mod sqlite;
}
