//! A private certificate authority for TLS tests, made in process with the `rcgen` crate (ECDSA
//! P-256 keys, signed through `ring`): a CA, a server certificate for the names a test chooses,
//! and a client certificate, all signed by the CA. No `openssl` command is needed.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use super::TempDir;

/// A throwaway CA and the certificates it signed, in a directory removed on drop: `ca.crt`,
/// `server.crt`/`server.key` (subject `localhost`, alternative names the server names given)
/// and `client.crt`/`client.key` (subject the client's name). Keys are unencrypted PKCS#8 PEM
/// (`BEGIN PRIVATE KEY`), which every server of the tests reads, ZooKeeper's Java included.
///
/// The directory and the files are readable by every user (the keys too), so that a server
/// running under its own account (the machine's PostgreSQL, say) can read them; a server that
/// insists on private keys gets a copy with the permissions it wants.
#[derive(Debug)]
pub struct TestCa {
    dir: TempDir,
}

/// How long the certificates are valid on either side of their making: a day back, for clocks
/// a little behind, and two days ahead, as long as any test run.
const VALID_BEFORE: Duration = Duration::from_secs(24 * 3600);
const VALID_AFTER: Duration = Duration::from_secs(2 * 24 * 3600);

impl TestCa {
    /// Makes the CA and its certificates. The server certificate is valid for `server_names`
    /// (host names, or IP addresses such as `127.0.0.1`); `client_name` is the client
    /// certificate's common name (the user name where a server maps certificates to users).
    ///
    /// # Errors
    /// When a name is not a valid DNS name or IP address, or the files cannot be written.
    pub fn new(server_names: &[&str], client_name: &str) -> io::Result<TestCa> {
        let dir = TempDir::new("distlock-test-ca")?;
        let d = dir.path();

        let mut ca_params = params(Vec::new(), "distlock test CA")?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(tls_error)?;
        let ca_cert = ca_params.self_signed(&ca_key).map_err(tls_error)?;
        let issuer = Issuer::new(ca_params, ca_key);
        write(d, "ca.crt", &ca_cert.pem())?;

        let server_names: Vec<String> = server_names.iter().map(|&n| n.to_owned()).collect();
        for (name, alt_names, subject) in [
            ("server", server_names, "localhost"),
            ("client", Vec::new(), client_name),
        ] {
            let mut leaf = params(alt_names, subject)?;
            leaf.is_ca = IsCa::ExplicitNoCa;
            leaf.use_authority_key_identifier_extension = true;
            let key = KeyPair::generate().map_err(tls_error)?;
            let cert = leaf.signed_by(&key, &issuer).map_err(tls_error)?;
            write(d, &format!("{name}.crt"), &cert.pem())?;
            write(d, &format!("{name}.key"), &key.serialize_pem())?;
        }
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
        Ok(TestCa { dir })
    }

    /// The directory that holds the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A file of the directory, e.g. `path("ca.crt")`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA's certificate (PEM): what a client trusts.
    pub fn ca_cert(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// The server's certificate and key (PEM).
    pub fn server_cert_and_key(&self) -> (PathBuf, PathBuf) {
        (self.path("server.crt"), self.path("server.key"))
    }

    /// The client's certificate and key (PEM).
    pub fn client_cert_and_key(&self) -> (PathBuf, PathBuf) {
        (self.path("client.crt"), self.path("client.key"))
    }
}

/// Parameters with subject `CN=common_name`, alternative names `alt_names` (an IP address
/// becomes an IP name, anything else a DNS name) and the validity window around now.
fn params(alt_names: Vec<String>, common_name: &str) -> io::Result<CertificateParams> {
    let mut params = CertificateParams::new(alt_names).map_err(tls_error)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(io::Error::other)?;
    let at = |secs: Duration| {
        let secs = i64::try_from(secs.as_secs()).map_err(io::Error::other)?;
        time::OffsetDateTime::from_unix_timestamp(secs).map_err(io::Error::other)
    };
    params.not_before = at(now.saturating_sub(VALID_BEFORE))?;
    params.not_after = at(now + VALID_AFTER)?;
    Ok(params)
}

/// Writes `text` to `dir/name`, readable by every user (see [`TestCa`]).
fn write(dir: &Path, name: &str, text: &str) -> io::Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

fn tls_error(e: rcgen::Error) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("test certificate: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::RootCertStore;

    use super::*;

    fn cert(ca: &TestCa, name: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(ca.path(name)).unwrap()
    }

    #[test]
    fn the_server_and_client_certificates_verify_against_the_ca() {
        let ca = TestCa::new(&["localhost", "127.0.0.1"], "tester").unwrap();
        // ring, as everywhere in distlock (its post-quantum-less provider is deprecated).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots.add(cert(&ca, "ca.crt")).unwrap();
        let roots = Arc::new(roots);
        let now = UnixTime::now();

        let servers = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .unwrap();
        for name in ["localhost", "127.0.0.1"] {
            let name = ServerName::try_from(name).unwrap();
            servers
                .verify_server_cert(&cert(&ca, "server.crt"), &[], &name, &[], now)
                .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        }
        let other = ServerName::try_from("example.com").unwrap();
        assert!(servers
            .verify_server_cert(&cert(&ca, "server.crt"), &[], &other, &[], now)
            .is_err());

        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .unwrap();
        clients
            .verify_client_cert(&cert(&ca, "client.crt"), &[], now)
            .unwrap();
        let client = cert(&ca, "client.crt");
        assert!(
            client.windows(6).any(|w| w == b"tester"),
            "subject CN=tester"
        );

        for key in ["server.key", "client.key"] {
            let pem = std::fs::read_to_string(ca.path(key)).unwrap();
            assert!(
                pem.starts_with("-----BEGIN PRIVATE KEY-----"),
                "{key}: PKCS#8"
            );
            assert!(matches!(
                PrivateKeyDer::from_pem_file(ca.path(key)).unwrap(),
                PrivateKeyDer::Pkcs8(_)
            ));
        }
    }
}
