//! TLS for `--tls-cert` and `--tls-key`: PEM files read once at start, rustls with ring (the
//! provider the library uses everywhere).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::Failure;

/// The acceptor for a certificate chain and its private key.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, Failure> {
    let bad = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        Failure::usage(format!("cannot use {what} {}: {e}", path.display()))
    };
    let certs: Vec<CertificateDer<'static>> = {
        let pem = std::fs::read(cert).map_err(|e| bad("the certificate", cert, &e))?;
        rustls_pemfile::certs(&mut pem.as_slice())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("the certificate", cert, &e))?
    };
    if certs.is_empty() {
        return Err(bad("the certificate", cert, &"no PEM certificate in it"));
    }
    let key_der: PrivateKeyDer<'static> = {
        let pem = std::fs::read(key).map_err(|e| bad("the key", key, &e))?;
        rustls_pemfile::private_key(&mut pem.as_slice())
            .map_err(|e| bad("the key", key, &e))?
            .ok_or_else(|| bad("the key", key, &"no PEM private key in it"))?
    };
    // ring: deprecated since rustls 0.23.48 for lacking post-quantum key exchange, but the
    // provider that has it (aws-lc-rs) needs a C toolchain, and distlock builds with Rust alone.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("the certificate", cert, &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| bad("the key", key, &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
