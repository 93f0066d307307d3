//! TLS for PostgreSQL: the `sslmode` choices, the rustls configuration, and the certificate
//! check that tells the auth guard whether a password may be sent.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::backends::sql::auth_guard::{AuthGuard, Watch};
use crate::error::{Error, Result};

/// How the connection is encrypted (`sslmode` in the URL), as libpq names it.
///
/// Whatever the mode, a password is sent in a readable form (cleartext or MD5, when the server
/// asks for those) only over TLS whose certificate was verified, unless
/// [`SqlOptions::allow_insecure_auth`](crate::backends::sql::SqlOptions::allow_insecure_auth) says otherwise; see the
/// [module docs](crate::backends::sql#passwords-and-tls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain (the default). The certificate is checked
    /// (against `sslrootcert`, else the Mozilla roots, for the host connected to); one that
    /// does not pass still encrypts, but the connection counts as unverified.
    Prefer,
    /// TLS or fail; the certificate is checked as with `Prefer`, and one that does not pass
    /// still encrypts (as in libpq), but the connection counts as unverified.
    Require,
    /// TLS with a certificate signed by a trusted CA (`sslrootcert`, else the Mozilla roots),
    /// whatever host name it names.
    VerifyCa,
    /// TLS with a trusted certificate for the host connected to.
    VerifyFull,
}

impl SslMode {
    pub(super) fn parse(value: &str) -> Result<Self> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::config(format!(
                    "postgres URL: sslmode must be disable, prefer, require, verify-ca or \
                     verify-full, got {other:?}"
                )))
            }
        })
    }
}

pub(super) fn provider() -> Arc<CryptoProvider> {
    crate::tls::provider()
}

/// The TLS files named in the URL (libpq's parameter names).
#[derive(Debug, Default)]
pub(super) struct TlsFiles {
    /// `sslrootcert`: PEM file of the CAs to verify the server against.
    pub(super) root_cert: Option<String>,
    /// `sslcert` and `sslkey`: the client's certificate chain and key (PEM), for servers that
    /// ask for one (`clientcert=verify-full` or `cert` in `pg_hba.conf`).
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
}

pub(super) fn read_certs(path: &str, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let bad = |e: &dyn fmt::Display| Error::config(format!("postgres: bad {what} {path:?}: {e}"));
    CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .map(|c| c.map_err(|e| bad(&e)))
        .collect()
}

/// How new connections are secured, and when a password may go out in a readable form.
pub(super) struct Transport {
    pub(super) ssl: SslMode,
    pub(super) provider: Arc<CryptoProvider>,
    pub(super) verifier: Arc<WebPkiServerVerifier>,
    pub(super) client_cert: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    pub(super) allow_insecure_auth: bool,
}

impl Transport {
    pub(super) fn new(ssl: SslMode, files: &TlsFiles, allow_insecure_auth: bool) -> Result<Self> {
        let provider = provider();
        let mut roots = rustls::RootCertStore::empty();
        match &files.root_cert {
            Some(path) => {
                for cert in read_certs(path, "sslrootcert")? {
                    roots.add(cert).map_err(|e| {
                        Error::config(format!("postgres: bad certificate in {path:?}: {e}"))
                    })?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| Error::config(format!("postgres: TLS setup: {e}")))?;
        let client_cert = match (&files.cert, &files.key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                use rustls::pki_types::pem::PemObject;
                let chain = read_certs(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| Error::config(format!("postgres: bad sslkey {key:?}: {e}")))?;
                Some((chain, Arc::new(key)))
            }
            _ => {
                return Err(Error::config(
                    "postgres URL: sslcert and sslkey go together (the client certificate and \
                     its key)",
                ))
            }
        };
        Ok(Transport {
            ssl,
            provider,
            verifier,
            client_cert,
            allow_insecure_auth,
        })
    }

    /// The TLS connector of one connection to `host`; it notes whether the server's
    /// certificate passed, and guards the password above TLS when it did not.
    pub(super) fn connector(
        &self,
        host: &str,
        refused: Arc<AtomicBool>,
    ) -> std::io::Result<GuardedTls> {
        let verified = Arc::new(AtomicBool::new(false));
        let builder = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Checked {
                inner: self.verifier.clone(),
                mode: self.ssl,
                verified: verified.clone(),
            }));
        let config = match &self.client_cert {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(std::io::Error::other)?,
            None => builder.with_no_client_auth(),
        };
        let mut make = MakeRustlsConnect::new(config);
        let Ok(tls) = MakeTlsConnect::<Plain>::make_tls_connect(&mut make, host);
        Ok(GuardedTls {
            tls,
            verified,
            allow_insecure_auth: self.allow_insecure_auth,
            refused,
        })
    }
}

/// TLS for one connection, with the password guard on top unless the certificate passed.
pub(super) struct GuardedTls {
    pub(super) tls: RustlsConnect,
    pub(super) verified: Arc<AtomicBool>,
    pub(super) allow_insecure_auth: bool,
    pub(super) refused: Arc<AtomicBool>,
}

/// A TCP connection with the password guard below TLS.
pub(super) type Plain = AuthGuard<tokio::net::TcpStream>;
/// `tokio-postgres-rustls`'s connector (its type is not exported by name).
pub(super) type RustlsConnect = <MakeRustlsConnect as MakeTlsConnect<Plain>>::TlsConnect;
pub(super) type TlsOf<S> = <RustlsConnect as TlsConnect<S>>::Stream;

impl<S> TlsConnect<S> for GuardedTls
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    type Stream = AuthGuard<TlsOf<S>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Stream>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let handshake = self.tls.connect(stream);
        Box::pin(async move {
            let stream = handshake.await?;
            let checked = self.allow_insecure_auth || self.verified.load(Ordering::Acquire);
            let watch = if checked { Watch::Off } else { Watch::Messages };
            Ok(AuthGuard::new(stream, watch, self.refused))
        })
    }
}

impl SslMode {
    pub(super) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Checks the server's certificate against the roots and notes whether it passed. With
/// `verify-ca` and `verify-full` a failure ends the handshake; with `prefer` and `require` the
/// connection stays encrypted but counts as unverified (a passing certificate must also name
/// the host). The handshake signatures are always verified.
#[derive(Debug)]
pub(super) struct Checked {
    pub(super) inner: Arc<WebPkiServerVerifier>,
    pub(super) mode: SslMode,
    pub(super) verified: Arc<AtomicBool>,
}

impl ServerCertVerifier for Checked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError;
        let outcome =
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            {
                // verify-ca: a trusted chain, whatever name the certificate carries.
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) if self.mode == SslMode::VerifyCa => Ok(ServerCertVerified::assertion()),
                other => other,
            };
        match outcome {
            Ok(v) => {
                self.verified.store(true, Ordering::Release);
                Ok(v)
            }
            Err(e) if matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull) => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "postgres: server certificate not verified");
                Ok(ServerCertVerified::assertion())
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
