//! Keeps a PostgreSQL password from leaving in a readable form over a connection whose server
//! is not verified: a stream wrapper that reads the server's authentication request before the
//! driver does, and fails the connection when the server asks for the password in cleartext
//! (`AuthenticationCleartextPassword`) or as an MD5 digest (`AuthenticationMD5Password`).
//! SCRAM-SHA-256 goes through: it proves knowledge of the password without revealing it.
//!
//! `tokio-postgres` answers those requests by itself and has no setting to refuse them, so the
//! check sits in the byte stream: below TLS on a plain connection (after the server declined
//! TLS with `N`), above TLS on an encrypted one whose certificate could not be verified.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `AuthenticationCleartextPassword` and `AuthenticationMD5Password`.
const CLEARTEXT: u32 = 3;
const MD5: u32 = 5;
const AUTH_OK: u32 = 0;

/// Where in the server's byte stream the guard is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watch {
    /// The client asked for TLS; the next byte is the server's `S` (TLS follows: another guard
    /// above TLS takes over) or `N` (plain: check the messages).
    SslReply,
    /// Checking messages until authentication is over.
    Messages,
    /// Nothing (more) to check.
    Off,
}

/// A stream that refuses to hand on a request for a readable password (see the module docs).
pub(crate) struct AuthGuard<S> {
    inner: S,
    watch: Watch,
    /// Bytes read from `inner` and not yet handed on.
    buf: Vec<u8>,
    /// How many bytes at the front of `buf` are checked and may be handed on.
    cleared: usize,
    /// Bytes of the current message still to come (all harmless).
    skip: usize,
    /// Stop checking once the current message is through (authentication succeeded).
    off_after: bool,
    /// Set when a request was refused, so that the caller can say why the connection failed.
    refused: Arc<AtomicBool>,
}

impl<S> AuthGuard<S> {
    pub(crate) fn new(inner: S, watch: Watch, refused: Arc<AtomicBool>) -> Self {
        AuthGuard {
            inner,
            watch,
            buf: Vec::new(),
            cleared: 0,
            skip: 0,
            off_after: false,
            refused,
        }
    }

    /// Clears as many buffered bytes as can be judged; fails on a refused request.
    fn scan(&mut self) -> io::Result<()> {
        loop {
            match self.watch {
                Watch::Off => {
                    self.cleared = self.buf.len();
                    return Ok(());
                }
                Watch::SslReply => {
                    let Some(&b) = self.buf.get(self.cleared) else {
                        return Ok(());
                    };
                    match b {
                        b'S' => {
                            self.cleared += 1;
                            self.watch = Watch::Off;
                        }
                        b'N' => {
                            self.cleared += 1;
                            self.watch = Watch::Messages;
                        }
                        // An error message instead (an old server): check it like the rest.
                        _ => self.watch = Watch::Messages,
                    }
                }
                Watch::Messages => {
                    if self.skip > 0 {
                        let n = self.skip.min(self.buf.len() - self.cleared);
                        self.cleared += n;
                        self.skip -= n;
                        if self.skip > 0 {
                            return Ok(());
                        }
                    }
                    if self.off_after {
                        self.watch = Watch::Off;
                        continue;
                    }
                    let rest = &self.buf[self.cleared..];
                    if rest.len() < 5 {
                        return Ok(());
                    }
                    let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
                    if len < 4 {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "malformed message from the server",
                        ));
                    }
                    if rest[0] == b'R' && len >= 8 {
                        if rest.len() < 9 {
                            return Ok(());
                        }
                        match u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) {
                            CLEARTEXT | MD5 => {
                                self.refused.store(true, Ordering::Release);
                                return Err(io::Error::new(
                                    io::ErrorKind::PermissionDenied,
                                    "the server asked for the password in a readable form",
                                ));
                            }
                            AUTH_OK => self.off_after = true,
                            _ => {}
                        }
                    }
                    self.cleared += 5;
                    self.skip = len - 4;
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.cleared > 0 {
                let n = this.cleared.min(out.remaining());
                out.put_slice(&this.buf[..n]);
                this.buf.drain(..n);
                this.cleared -= n;
                return Poll::Ready(Ok(()));
            }
            if this.watch == Watch::Off && this.buf.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            this.scan()?;
            if this.cleared > 0 {
                continue;
            }
            let mut chunk = [0u8; 4096];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // End of stream: an incomplete message cannot be a request for the password.
                if this.buf.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.cleared = this.buf.len();
                this.watch = Watch::Off;
                continue;
            }
            this.buf.extend_from_slice(read.filled());
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S> tokio_postgres::tls::TlsStream for AuthGuard<S>
where
    S: tokio_postgres::tls::TlsStream + Unpin,
{
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        self.inner.channel_binding()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    async fn read_all(bytes: Vec<u8>, watch: Watch) -> (io::Result<Vec<u8>>, bool) {
        let refused = Arc::new(AtomicBool::new(false));
        let mut g = AuthGuard::new(&bytes[..], watch, refused.clone());
        let mut out = Vec::new();
        let r = g.read_to_end(&mut out).await.map(|_| out);
        (r, refused.load(Ordering::Acquire))
    }

    #[tokio::test]
    async fn sql_guard_refuses_cleartext_and_md5_requests() {
        for code in [CLEARTEXT, MD5] {
            let mut stream = b"N".to_vec();
            stream.extend(message(b'R', &code.to_be_bytes()));
            let (r, refused) = read_all(stream, Watch::SslReply).await;
            assert!(r.is_err() && refused, "code {code}");
        }
    }

    #[tokio::test]
    async fn sql_guard_passes_scram_and_everything_after_authentication() {
        let mut stream = message(b'R', &10u32.to_be_bytes());
        stream.extend(message(b'R', &AUTH_OK.to_be_bytes()));
        // After authentication nothing is judged, not even what looks like a request.
        stream.extend(message(b'R', &CLEARTEXT.to_be_bytes()));
        stream.extend(message(b'Z', b"I"));
        let (r, refused) = read_all(stream.clone(), Watch::Messages).await;
        assert_eq!(r.unwrap(), stream);
        assert!(!refused);
        let mut tls = b"S".to_vec();
        tls.extend(message(b'R', &CLEARTEXT.to_be_bytes()));
        assert_eq!(read_all(tls.clone(), Watch::SslReply).await.0.unwrap(), tls);
    }
}
