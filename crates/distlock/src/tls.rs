//! The rustls crypto provider: ring, everywhere.
//!
//! With the `zookeeper-tls` feature, `zookeeper-client` turns on rustls's default features, so
//! rustls is built with both ring and aws-lc-rs. Code that calls `ClientConfig::builder()`
//! (`zookeeper-client` itself, the `redis` crate for `rediss://`, `mysql_async`) then needs a
//! process-wide default provider, or panics. distlock builds its own configurations with ring
//! explicitly, and installs ring as the process default before those crates build theirs, unless
//! the application installed one first (which is then used).

use std::sync::Arc;

/// ring, the provider distlock uses.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(ring())
}

/// ring's provider. rustls 0.23.48 deprecates it for lacking post-quantum key exchange; the
/// provider that has it (aws-lc-rs) needs a C toolchain and CMake to build, and distlock builds
/// with the Rust toolchain alone.
#[allow(deprecated)]
fn ring() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Installs ring as rustls's process default, unless a default is already installed. Only
/// `zookeeper-tls` builds rustls with a second provider, so only then is it called.
#[cfg(feature = "zookeeper-tls")]
pub(crate) fn ensure_default_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a default exists either way.
        let _ = ring().install_default();
    }
}
