//! One connection: TCP or TLS, logged in and on its database, whose task writes its
//! requests and reads their replies itself; and a connection subscribed to a channel.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::codec::{encode, parse};
use super::{Reply, RespError};

/// How connections are secured: the server's certificate is verified against the roots of
/// `connector` for the host part of the address connected to (a name or an IP address).
#[derive(Clone)]
pub(crate) struct Tls {
    connector: TlsConnector,
}

impl Tls {
    /// Roots from `ca_pem` (PEM certificates), else the Mozilla roots.
    pub(crate) fn new(ca_pem: Option<&[u8]>) -> Result<Tls, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        match ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| format!("bad PEM certificate: {e}"))?;
                    roots
                        .add(cert)
                        .map_err(|e| format!("bad certificate: {e}"))?;
                }
                if roots.is_empty() {
                    return Err("no PEM certificate in it".into());
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    async fn wrap(&self, addr: &str, tcp: TcpStream) -> io::Result<Stream> {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{host:?} is not a name or address a certificate can be verified for"),
            )
        })?;
        let tls = self.connector.connect(name, tcp).await?;
        Ok(Stream::Tls(Box::new(tls)))
    }
}

/// A connection's byte stream: plain TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

pub(super) struct Conn {
    /// The pool's generation when the connection was opened; see
    /// [`Pool::clear`](super::Pool::clear).
    pub(super) generation: u64,
    stream: Stream,
    buf: Vec<u8>,
    start: usize,
}

/// A connection to `addr`, logged in and on database `db`.
pub(super) async fn open(
    addr: &str,
    user: Option<&str>,
    password: Option<&str>,
    db: u16,
    timeout: Duration,
    tls: Option<&Tls>,
) -> Result<Conn, RespError> {
    let connect = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        match tls {
            None => Ok(Stream::Plain(tcp)),
            Some(tls) => tls.wrap(addr, tcp).await,
        }
    };
    let stream = tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
        .map_err(|e| tls_error(addr, tls.is_some(), e))?;
    let mut conn = Conn {
        generation: 0,
        stream,
        buf: Vec::with_capacity(512),
        start: 0,
    };
    let mut hello: Vec<Vec<&[u8]>> = Vec::new();
    if let Some(pw) = password {
        match user {
            Some(u) => hello.push(vec![b"AUTH", u.as_bytes(), pw.as_bytes()]),
            None => hello.push(vec![b"AUTH", pw.as_bytes()]),
        }
    }
    let db_text = db.to_string();
    if db != 0 {
        hello.push(vec![b"SELECT", db_text.as_bytes()]);
    }
    if hello.is_empty() {
        // A server at its client limit accepts the connection, writes its refusal and
        // closes it. Read that here, where nothing of a request has been sent, so that the
        // pool can wait for a connection it already has (`RespError::refused`).
        hello.push(vec![b"PING"]);
    }
    let replies = tokio::time::timeout(timeout, conn.exchange(&hello))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "handshake timed out"))??;
    for r in replies {
        if let Reply::Error(e) = r {
            return Err(RespError::Server(e));
        }
    }
    Ok(conn)
}

/// A certificate the client does not trust is a configuration error, not a server that is
/// down: retrying will not help, and the message says so.
fn tls_error(addr: &str, tls: bool, e: io::Error) -> RespError {
    let text = e.to_string();
    if tls && (e.kind() == io::ErrorKind::InvalidData || e.kind() == io::ErrorKind::InvalidInput) {
        return RespError::Server(format!("TLS with {addr} failed: {text}"));
    }
    RespError::Io(e)
}

/// A connection subscribed to one channel, for the Sentinels' `+switch-master` events.
pub(crate) struct Subscriber(Conn);

impl Subscriber {
    /// Connects to `addr` (with `user` and `password` if given) and subscribes to `channel`.
    pub(crate) async fn connect(
        addr: &str,
        user: Option<&str>,
        password: Option<&str>,
        timeout: Duration,
        tls: Option<&Tls>,
        channel: &str,
    ) -> Result<Subscriber, RespError> {
        let mut conn = open(addr, user, password, 0, timeout, tls).await?;
        let cmd: [&[u8]; 2] = [b"SUBSCRIBE", channel.as_bytes()];
        let reply = tokio::time::timeout(timeout, conn.exchange(&[cmd]))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "SUBSCRIBE timed out"))??;
        match reply.into_iter().next() {
            Some(Reply::Array(Some(_))) => Ok(Subscriber(conn)),
            Some(Reply::Error(e)) => Err(RespError::Server(e)),
            r => Err(RespError::Server(format!(
                "unexpected SUBSCRIBE reply {r:?}"
            ))),
        }
    }

    /// The payload of the next message; waits for it without limit.
    pub(crate) async fn next_message(&mut self) -> Result<Vec<u8>, RespError> {
        loop {
            if let Reply::Array(Some(items)) = self.0.read_reply().await? {
                if let [Reply::Bulk(Some(kind)), _, Reply::Bulk(Some(payload))] = items.as_slice() {
                    if kind == b"message" {
                        return Ok(payload.clone());
                    }
                }
            }
        }
    }
}

impl Conn {
    pub(super) async fn exchange<'a, C: AsRef<[&'a [u8]]>>(
        &mut self,
        cmds: &[C],
    ) -> Result<Vec<Reply>, RespError> {
        let mut out = Vec::new();
        for cmd in cmds {
            encode(&mut out, cmd.as_ref());
        }
        self.send(&out, cmds.len()).await
    }

    /// Writes `out`, encoded commands, and reads `count` replies.
    pub(super) async fn send(&mut self, out: &[u8], count: usize) -> Result<Vec<Reply>, RespError> {
        self.stream
            .write_all(out)
            .await
            .map_err(RespError::Unsent)?;
        let mut replies = Vec::with_capacity(count);
        while replies.len() < count {
            replies.push(self.read_reply().await?);
        }
        Ok(replies)
    }

    async fn read_reply(&mut self) -> Result<Reply, RespError> {
        loop {
            match parse(&self.buf[self.start..]) {
                Ok(Some((reply, used))) => {
                    self.start += used;
                    if self.start == self.buf.len() {
                        self.buf.clear();
                        self.start = 0;
                    }
                    return Ok(reply);
                }
                Ok(None) => {}
                Err(e) => return Err(RespError::Io(io::Error::new(io::ErrorKind::InvalidData, e))),
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(RespError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }
}
