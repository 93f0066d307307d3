//! `zks://`: TLS to every server of the ensemble, verified against the URL's `ca_file`, with
//! an optional client certificate (`cert_file`, `key_file`). Needs the `zookeeper-tls` feature.
//!
//! The client (`zookeeper-client`) reports a failed handshake only as a lost connection, so when
//! no session can be established this module makes one handshake of its own to each server, with
//! the same CA and certificate, to say why: an untrusted server certificate, or a server that
//! refused the handshake (it wants a client certificate, say).

use super::address::TlsFiles;
use super::*;

/// The TLS settings of a `zks://` backend.
#[cfg(feature = "zookeeper-tls")]
pub(super) struct Tls {
    /// What the ZooKeeper client connects with.
    pub(super) options: zookeeper_client::TlsOptions,
    /// The same CA and certificate, for the handshake that explains a failure.
    config: Arc<rustls::ClientConfig>,
}

/// The TLS settings of a `zks://` backend (none without the `zookeeper-tls` feature).
#[cfg(not(feature = "zookeeper-tls"))]
pub(super) enum Tls {}

#[cfg(not(feature = "zookeeper-tls"))]
pub(super) fn load(_files: &TlsFiles, _hosts: &str) -> Result<Tls> {
    Err(Error::Unsupported {
        backend: KIND,
        what: "zks:// (TLS): this build lacks the `zookeeper-tls` feature".into(),
    })
}

#[cfg(not(feature = "zookeeper-tls"))]
impl Tls {
    pub(super) async fn diagnose(&self, _hosts: &str) -> Option<Error> {
        match *self {}
    }
}

/// Reads the files of a `zks://` URL, and checks that every host (`host:port,...`) is a name
/// or address a certificate can be verified for.
#[cfg(feature = "zookeeper-tls")]
pub(super) fn load(files: &TlsFiles, hosts: &str) -> Result<Tls> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    for hp in hosts.split(',') {
        let host = hp.rsplit_once(':').map_or(hp, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if ServerName::try_from(host).is_err() {
            return Err(Error::config(format!(
                "zk URL: zks:// host {host:?} is not a DNS name or IP address that a \
                 certificate can be verified for"
            )));
        }
    }
    crate::tls::ensure_default_provider();
    let read = |param: &str, path: &str| {
        std::fs::read_to_string(path)
            .map_err(|e| Error::config(format!("zk URL: {param}: cannot read {path:?}: {e}")))
    };
    let bad = |param: &str, path: &str, e: &dyn fmt::Display| {
        Error::config(format!("zk URL: {param}: {path:?} is not usable: {e}"))
    };
    let ca = read("ca_file", &files.ca_file)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        let cert = cert.map_err(|e| bad("ca_file", &files.ca_file, &e))?;
        roots
            .add(cert)
            .map_err(|e| bad("ca_file", &files.ca_file, &e))?;
    }
    if roots.is_empty() {
        return Err(bad("ca_file", &files.ca_file, &"no PEM certificate in it"));
    }
    let mut options = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(|e| bad("ca_file", &files.ca_file, &e))?;
    let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config(format!("zk URL: TLS versions: {e}")))?
        .with_root_certificates(roots);
    let config = match &files.identity {
        None => builder.with_no_client_auth(),
        Some((cert_file, key_file)) => {
            let cert = read("cert_file", cert_file)?;
            let key = read("key_file", key_file)?;
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad("cert_file", cert_file, &e))?;
            if chain.is_empty() {
                return Err(bad("cert_file", cert_file, &"no PEM certificate in it"));
            }
            let der = PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|e| bad("key_file", key_file, &e))?;
            options = options
                .with_pem_identity(&cert, &key)
                .map_err(|e| bad("cert_file", cert_file, &e))?;
            builder
                .with_client_auth_cert(chain, der)
                .map_err(|e| bad("key_file", key_file, &e))?
        }
    };
    Ok(Tls {
        options,
        config: Arc::new(config),
    })
}

#[cfg(feature = "zookeeper-tls")]
impl Tls {
    /// Why no session could be established, when TLS is the reason: a handshake of its own to
    /// each server (a second each at most). `None` when some server completes it, or none
    /// answers at all (then the failure is not TLS's).
    pub(super) async fn diagnose(&self, hosts: &str) -> Option<Error> {
        let config = self.config.clone();
        let hosts = hosts.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut first = None;
            for hp in hosts.split(',') {
                match handshake(&config, hp) {
                    Ok(true) => return None,
                    Ok(false) => {}
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            first
        })
        .await
        .ok()
        .flatten()
    }
}

/// One TLS handshake with `host:port`: `Ok(true)` when it succeeds, `Ok(false)` when the server
/// cannot be reached, the error when TLS failed.
#[cfg(feature = "zookeeper-tls")]
fn handshake(config: &Arc<rustls::ClientConfig>, hostport: &str) -> Result<bool, Error> {
    use std::io::Read;
    use std::net::{TcpStream, ToSocketAddrs};

    let Some((host, port)) = hostport.rsplit_once(':') else {
        return Ok(false);
    };
    let Ok(port) = port.parse::<u16>() else {
        return Ok(false);
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_owned()) else {
        return Ok(false);
    };
    let limit = Duration::from_secs(1);
    let Ok(addrs) = (host, port).to_socket_addrs() else {
        return Ok(false);
    };
    let Some(mut sock) = addrs
        .into_iter()
        .find_map(|addr| TcpStream::connect_timeout(&addr, limit).ok())
    else {
        return Ok(false);
    };
    let _ = sock.set_read_timeout(Some(limit));
    let _ = sock.set_write_timeout(Some(limit));
    let Ok(mut conn) = rustls::ClientConnection::new(config.clone(), name) else {
        return Ok(false);
    };
    let failed = |e: std::io::Error| -> Result<bool, Error> {
        let Some(tls) = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        else {
            return Ok(false);
        };
        let hint = match tls {
            rustls::Error::InvalidCertificate(_) => {
                " (the server's certificate is not trusted: is ca_file the CA that signed it, \
                 and is it valid for this host name?)"
            }
            rustls::Error::AlertReceived(_) => {
                " (the server refused the handshake: does it require a client certificate? \
                 give cert_file and key_file, of a certificate its CA signed)"
            }
            _ => "",
        };
        Err(Error::backend(
            KIND,
            format!("TLS with {hostport} failed: {tls}{hint}"),
        ))
    };
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut sock) {
            return failed(e);
        }
    }
    // With TLS 1.3 a server that rejects the client's certificate says so after the
    // client's side of the handshake: wait briefly for that alert (a server that accepted
    // sends nothing before the client speaks).
    let mut stream = rustls::Stream::new(&mut conn, &mut sock);
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => failed(e),
        _ => Ok(true),
    }
}
