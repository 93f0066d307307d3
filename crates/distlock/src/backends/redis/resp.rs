//! A minimal RESP2 client for the lock path: pooled connections, each request written and its
//! reply read by the calling task itself. A multiplexed connection routes every request
//! through a driver task and back, which is most of a lock cycle's client-side CPU; here there
//! is nothing between the caller and the socket.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Simple(String),
    Array(Option<Vec<Reply>>),
    Error(String),
}

impl Reply {
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    pub(crate) fn ints(&self) -> Option<Vec<i64>> {
        match self {
            Reply::Array(Some(items)) => items.iter().map(Reply::int).collect(),
            _ => None,
        }
    }
}

/// Where and how to connect.
#[derive(Clone)]
pub(crate) struct ConnInfo {
    pub(crate) addr: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: u16,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// With Sentinel, where `addr` is looked up: at every new connection, so that a pool
    /// emptied after a failure reconnects to whichever node is master by then.
    pub(crate) sentinel: Option<SentinelInfo>,
    /// With Redis Cluster, the id the node at `addr` had in the slot map: every new
    /// connection checks it with `CLUSTER MYID`, so that a request meant for a node that is
    /// gone never runs on whatever server took its address since (another cluster's node, a
    /// plain Redis), where a `SET NX` would succeed.
    pub(crate) node_id: Option<String>,
    /// TLS for every connection (`rediss+sentinel://`, `rediss+cluster://`), the Sentinels'
    /// included.
    pub(crate) tls: Option<Tls>,
}

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

/// How to find the master through Sentinel.
#[derive(Clone)]
pub(crate) struct SentinelInfo {
    pub(crate) hosts: Vec<String>,
    pub(crate) master: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
}

/// Errors of the transport: the socket (retryable) or a reply that is an error.
#[derive(Debug)]
pub(crate) enum RespError {
    Io(io::Error),
    /// Writing the request failed, so no complete command reached the server (an idle
    /// connection that went stale, or one whose runtime is gone).
    Unsent(io::Error),
    Server(String),
}

impl From<io::Error> for RespError {
    fn from(e: io::Error) -> Self {
        RespError::Io(e)
    }
}

impl RespError {
    /// The same error for another request of a batch (`io::Error` is not `Clone`).
    fn copy(&self) -> RespError {
        let io = |e: &io::Error| io::Error::new(e.kind(), e.to_string());
        match self {
            RespError::Io(e) => RespError::Io(io(e)),
            RespError::Unsent(e) => RespError::Unsent(io(e)),
            RespError::Server(s) => RespError::Server(s.clone()),
        }
    }
}

struct Conn {
    /// The pool's generation when the connection was opened; see [`Pool::clear`].
    generation: u64,
    stream: Stream,
    buf: Vec<u8>,
    start: usize,
}

/// Connections to one server: at most [`MAX_OPEN`] in use at once, all kept once opened.
///
/// A request that finds every connection in use waits in [`Line`], and goes out with the
/// others waiting there in one write, on the next connection that comes free: under load the
/// server reads and answers a batch of requests per system call instead of one, which is most
/// of what a request costs it. A request that finds a connection free is written at once by
/// its own task, as before.
pub(crate) struct Pool {
    info: ConnInfo,
    idle: Mutex<Vec<Conn>>,
    /// Connections in use, and the requests waiting for one. Without a bound, a burst of
    /// concurrent requests (a registry acquiring 100,000 keys at once) would open a
    /// connection for each.
    line: Mutex<Line>,
    /// With Sentinel: the master the last connection went to.
    master: Mutex<Option<String>>,
    /// Counts [`Pool::clear`]s: a connection opened before the last one is not kept.
    generation: AtomicU64,
}

const MAX_IDLE: usize = MAX_OPEN;
const MAX_OPEN: usize = 32;
/// The most requests one batch carries, so that its reply, and so each caller's, stays prompt.
const MAX_BATCH: usize = 256;

#[derive(Default)]
struct Line {
    /// Connections in use (or being opened), at most [`MAX_OPEN`].
    busy: usize,
    /// Requests waiting for a connection, first come first sent.
    waiting: VecDeque<Waiting>,
}

/// A request in [`Line`]: its commands, encoded, and where its outcome goes.
struct Waiting {
    request: Request,
    to: oneshot::Sender<Turn>,
}

/// Encoded commands and how many replies they get.
struct Request {
    out: Vec<u8>,
    count: usize,
}

/// What a waiting request is told.
enum Turn {
    /// Another request's task sent it along with its own: these are its replies.
    Answered(Result<Vec<Reply>, RespError>),
    /// A connection came free (`None`: a slot to open one in): send the request, with
    /// whatever else waits, and pass the connection on.
    Lead(Option<Conn>, Request),
}

impl Pool {
    pub(crate) fn new(info: ConnInfo) -> Self {
        Pool {
            info,
            idle: Mutex::new(Vec::new()),
            line: Mutex::new(Line::default()),
            master: Mutex::new(None),
            generation: AtomicU64::new(0),
        }
    }

    /// Sends each command of `cmds` in one write and returns their replies in order. Error
    /// replies are returned as [`Reply::Error`]; only the transport fails the call. Waiting
    /// for a connection is not part of the response timeout.
    pub(crate) async fn pipeline<'a, C: AsRef<[&'a [u8]]>>(
        &self,
        cmds: &[C],
    ) -> Result<Vec<Reply>, RespError> {
        let size = cmds
            .iter()
            .map(|c| 16 + c.as_ref().iter().map(|a| a.len() + 16).sum::<usize>())
            .sum();
        let mut out = Vec::with_capacity(size);
        for cmd in cmds {
            encode(&mut out, cmd.as_ref());
        }
        let request = Request {
            out,
            count: cmds.len(),
        };
        // Decided under the lock, waited for after it (a `MutexGuard` is not `Send`).
        let queued = {
            let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
            if line.busy < MAX_OPEN {
                line.busy += 1;
                Err(request)
            } else {
                let (to, from) = oneshot::channel();
                line.waiting.push_back(Waiting { request, to });
                Ok(from)
            }
        };
        let (conn, request) = match queued {
            Err(request) => {
                let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
                (idle, request)
            }
            Ok(from) => {
                let mut turn = TurnGuard { pool: self, from };
                match (&mut turn.from).await {
                    Ok(Turn::Answered(replies)) => return replies,
                    Ok(Turn::Lead(conn, request)) => (conn, request),
                    // Never dropped unanswered but by a batch dropped mid-exchange.
                    Err(_) => {
                        return Err(RespError::Io(io::Error::other(
                            "the batch carrying this request was abandoned",
                        )))
                    }
                }
            }
        };
        let mut batch = Batch {
            pool: self,
            done: false,
            conn,
            own: request.count,
            out: request.out,
            count: request.count,
            others: Vec::new(),
        };
        batch.take_waiting();
        batch.send().await
    }

    /// Passes a connection that is done with (`None`: lost) to the first request waiting,
    /// else keeps it idle and frees its slot. A connection opened before the last
    /// [`clear`](Self::clear) goes no further (it may reach a node that is no longer the one
    /// to use): the request gets the slot and opens a new one.
    fn pass_on(&self, conn: Option<Conn>) {
        let generation = self.generation.load(Ordering::Acquire);
        let mut conn = conn.filter(|c| c.generation == generation);
        loop {
            let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
            let Some(w) = line.waiting.pop_front() else {
                line.busy -= 1;
                drop(line);
                // Only a connection whose replies were all read comes here: it is in step.
                if let Some(c) = conn {
                    let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                    if idle.len() < MAX_IDLE
                        && c.generation == self.generation.load(Ordering::Acquire)
                    {
                        idle.push(c);
                    }
                }
                return;
            };
            drop(line);
            match w.to.send(Turn::Lead(conn, w.request)) {
                Ok(()) => return,
                // Its caller gave up: the next one.
                Err(Turn::Lead(c, _)) => conn = c,
                Err(Turn::Answered(_)) => conn = None,
            }
        }
    }

    /// The cluster node id its connections check, if any.
    pub(crate) fn node_id(&self) -> Option<&str> {
        self.info.node_id.as_deref()
    }

    /// Forgets idle connections (after a failure, they may all be broken; after a failover,
    /// they go to the old master), and those in use when they come back.
    pub(crate) fn clear(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        self.generation.fetch_add(1, Ordering::AcqRel);
        idle.clear();
    }

    async fn connect(&self) -> Result<Conn, RespError> {
        // Read before connecting: a `clear` while this connects makes it one not to keep.
        let generation = self.generation.load(Ordering::Acquire);
        let mut conn = self.connect_now().await?;
        conn.generation = generation;
        Ok(conn)
    }

    async fn connect_now(&self) -> Result<Conn, RespError> {
        let info = &self.info;
        let Some(sentinel) = &info.sentinel else {
            let mut conn = open(
                &info.addr,
                info.user.as_deref(),
                info.password.as_deref(),
                info.db,
                info.connect_timeout,
                info.tls.as_ref(),
            )
            .await?;
            if let Some(id) = &info.node_id {
                check_node_id(&mut conn, &info.addr, id, info.connect_timeout).await?;
            }
            return Ok(conn);
        };
        let addr = self.master_addr(sentinel).await?;
        let mut conn = open(
            &addr,
            info.user.as_deref(),
            info.password.as_deref(),
            info.db,
            info.connect_timeout,
            info.tls.as_ref(),
        )
        .await?;
        // The Sentinels may still name a master that a failover has just demoted.
        let role = tokio::time::timeout(
            info.connect_timeout,
            conn.exchange(&[&[b"ROLE".as_slice()]]),
        )
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "ROLE timed out"))??;
        match role.first() {
            Some(Reply::Array(Some(r))) if matches!(r.first(), Some(Reply::Bulk(Some(b))) if b == b"master") =>
            {
                *self.master.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
                Ok(conn)
            }
            _ => Err(RespError::Io(io::Error::other(format!(
                "{addr}, named master by the Sentinels, is not a master (a failover is under way)"
            )))),
        }
    }

    /// Asks the Sentinels, in turn, for the master's address.
    async fn master_addr(&self, s: &SentinelInfo) -> Result<String, RespError> {
        let mut errors = Vec::new();
        for host in &s.hosts {
            let ask = async {
                let mut conn = open(
                    host,
                    s.user.as_deref(),
                    s.password.as_deref(),
                    0,
                    self.info.connect_timeout,
                    self.info.tls.as_ref(),
                )
                .await?;
                let cmd: [&[u8]; 3] =
                    [b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", s.master.as_bytes()];
                let reply = tokio::time::timeout(self.info.connect_timeout, conn.exchange(&[cmd]))
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no reply in time"))??;
                match reply.first() {
                    Some(Reply::Array(Some(a))) => match (a.first(), a.get(1)) {
                        (Some(Reply::Bulk(Some(ip))), Some(Reply::Bulk(Some(port)))) => {
                            Ok(format!(
                                "{}:{}",
                                String::from_utf8_lossy(ip),
                                String::from_utf8_lossy(port)
                            ))
                        }
                        _ => Err(RespError::Server(format!("unexpected reply {a:?}"))),
                    },
                    Some(Reply::Array(None)) | Some(Reply::Bulk(None)) => Err(RespError::Server(
                        format!("the Sentinel does not know a master named {:?}", s.master),
                    )),
                    Some(Reply::Error(e)) => Err(RespError::Server(e.clone())),
                    r => Err(RespError::Server(format!("unexpected reply {r:?}"))),
                }
            };
            match ask.await {
                Ok(addr) => return Ok(addr),
                Err(RespError::Server(e))
                    if e.starts_with("the Sentinel does not know")
                        || e.starts_with("TLS with")
                        || e.starts_with("NOAUTH")
                        || e.starts_with("WRONGPASS") =>
                {
                    return Err(RespError::Server(format!("sentinel {host}: {e}")))
                }
                Err(e) => errors.push(format!("{host}: {e:?}")),
            }
        }
        Err(RespError::Io(io::Error::other(format!(
            "no Sentinel answered: {}",
            errors.join("; ")
        ))))
    }

    /// With Sentinel: where the Sentinels say the master is now.
    pub(crate) async fn current_master(&self) -> Result<String, RespError> {
        match &self.info.sentinel {
            Some(s) => self.master_addr(s).await,
            None => Ok(self.info.addr.clone()),
        }
    }

    /// The master the last connection went to, with Sentinel.
    pub(crate) fn master(&self) -> Option<String> {
        self.master
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The requests one connection carries in one write: its own task's first (`own` replies),
/// then those it took from the line, whose tasks wait for their replies.
struct Batch<'p> {
    pool: &'p Pool,
    /// Set once the connection is passed on; a batch dropped before (its caller gave up
    /// mid-exchange) frees its slot, and its connection, out of step, is closed.
    done: bool,
    conn: Option<Conn>,
    own: usize,
    out: Vec<u8>,
    count: usize,
    others: Vec<(usize, oneshot::Sender<Turn>)>,
}

impl Batch<'_> {
    /// Takes requests waiting in the line, up to [`MAX_BATCH`] in all; not those whose
    /// callers gave up (nothing of theirs is sent).
    fn take_waiting(&mut self) {
        let mut line = self.pool.line.lock().unwrap_or_else(|e| e.into_inner());
        while self.others.len() + 1 < MAX_BATCH {
            let Some(w) = line.waiting.pop_front() else {
                break;
            };
            if w.to.is_closed() {
                continue;
            }
            self.out.extend_from_slice(&w.request.out);
            self.count += w.request.count;
            self.others.push((w.request.count, w.to));
        }
    }

    /// Sends the batch, answers the others, passes the connection on and returns the own
    /// replies.
    async fn send(mut self) -> Result<Vec<Reply>, RespError> {
        let result = self.exchange().await.map(|mut replies| {
            let mut rest = replies.split_off(self.own);
            for (count, to) in self.others.drain(..).rev() {
                let theirs = rest.split_off(rest.len() - count);
                let _ = to.send(Turn::Answered(Ok(theirs)));
            }
            replies
        });
        if let Err(e) = &result {
            for (_, to) in self.others.drain(..) {
                let _ = to.send(Turn::Answered(Err(e.copy())));
            }
        }
        self.done = true;
        self.pool.pass_on(self.conn.take());
        result
    }

    async fn exchange(&mut self) -> Result<Vec<Reply>, RespError> {
        let pool = self.pool;
        let reused = self.conn.is_some();
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => pool.connect().await.map_err(unsent)?,
        };
        let timeout = pool.info.response_timeout;
        let no_reply = || io::Error::new(io::ErrorKind::TimedOut, "no reply in time");
        let replies = match tokio::time::timeout(timeout, conn.send(&self.out, self.count)).await {
            Ok(Err(RespError::Unsent(e))) if reused => {
                // An idle connection can go stale (its runtime was shut down, the server
                // closed it): nothing was sent, so the request goes out on a new one.
                tracing::debug!(error = %e, "idle connection unusable; reconnecting");
                pool.clear();
                conn = pool.connect().await.map_err(unsent)?;
                tokio::time::timeout(timeout, conn.send(&self.out, self.count))
                    .await
                    .map_err(|_| no_reply())??
            }
            r => r.map_err(|_| no_reply())??,
        };
        // Only a connection whose replies were all read goes on: it is in step again.
        self.conn = Some(conn);
        Ok(replies)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.pool.pass_on(None);
        }
    }
}

/// A place in [`Line`], for a request whose caller may give up: a connection handed to it
/// after that is passed on, never lost with its slot.
struct TurnGuard<'p> {
    pool: &'p Pool,
    from: oneshot::Receiver<Turn>,
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        self.from.close();
        if let Ok(Turn::Lead(conn, _)) = self.from.try_recv() {
            self.pool.pass_on(conn);
        }
    }
}

/// Fails unless the server behind `conn` is cluster node `id`. An I/O error, so that the
/// pool reports the request unsent and the cluster client reads the slot map again.
async fn check_node_id(
    conn: &mut Conn,
    addr: &str,
    id: &str,
    timeout: Duration,
) -> Result<(), RespError> {
    let reply = tokio::time::timeout(timeout, conn.exchange(&[&[b"CLUSTER".as_slice(), b"MYID"]]))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "CLUSTER MYID timed out"))??;
    match reply.first() {
        Some(Reply::Bulk(Some(got))) if got == id.as_bytes() => Ok(()),
        r => Err(RespError::Io(io::Error::other(format!(
            "{addr} is no longer cluster node {id} (it answers CLUSTER MYID with {r:?}): the slot map is out of date"
        )))),
    }
}

/// A connection that could not be opened sent nothing: I/O errors of connecting are
/// [`RespError::Unsent`], so a caller knows it may send the request elsewhere.
fn unsent(e: RespError) -> RespError {
    match e {
        RespError::Io(e) => RespError::Unsent(e),
        other => other,
    }
}

/// A connection to `addr`, logged in and on database `db`.
async fn open(
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
    if !hello.is_empty() {
        let replies = tokio::time::timeout(timeout, conn.exchange(&hello))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "handshake timed out"))??;
        for r in replies {
            if let Reply::Error(e) = r {
                return Err(RespError::Server(e));
            }
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
    async fn exchange<'a, C: AsRef<[&'a [u8]]>>(
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
    async fn send(&mut self, out: &[u8], count: usize) -> Result<Vec<Reply>, RespError> {
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

fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    header(out, b'*', args.len());
    for a in args {
        header(out, b'$', a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes `<kind><n>\r\n` without going through `fmt`.
fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// Longest bulk string accepted: Redis's own `proto-max-bulk-len` default.
const MAX_BULK_LEN: usize = 512 * 1024 * 1024;
/// Deepest nesting of arrays accepted; lock replies nest one level.
const MAX_DEPTH: usize = 32;

/// Parses one reply from the front of `buf`: `Ok(None)` when it is not complete yet. Malformed
/// input (a bad type byte or number, a length beyond [`MAX_BULK_LEN`], nesting beyond
/// [`MAX_DEPTH`]) is an error, never a panic.
fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    parse_at(buf, 0)
}

fn parse_at(buf: &[u8], depth: usize) -> Result<Option<(Reply, usize)>, String> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if end == 0 {
        return Err("empty reply line".into());
    }
    let kind = buf[0];
    let line = &buf[1..end];
    let text = || String::from_utf8_lossy(line).into_owned();
    let number = || -> Result<i64, String> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad number {:?}", String::from_utf8_lossy(line)))
    };
    let after = end + 2;
    match kind {
        b'+' => Ok(Some((Reply::Simple(text()), after))),
        b'-' => Ok(Some((Reply::Error(text()), after))),
        b':' => Ok(Some((Reply::Int(number()?), after))),
        b'$' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some((Reply::Bulk(None), after)));
            }
            let n = usize::try_from(n)
                .ok()
                .filter(|n| *n <= MAX_BULK_LEN)
                .ok_or_else(|| format!("bulk length {n} is too large"))?;
            // `after + n + 2` cannot overflow: n is bounded and `after` is within `buf`.
            let total = after + n + 2;
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[after + n..total] != b"\r\n" {
                return Err("bulk string not terminated by CRLF".into());
            }
            Ok(Some((
                Reply::Bulk(Some(buf[after..after + n].to_vec())),
                total,
            )))
        }
        b'*' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some((Reply::Array(None), after)));
            }
            if depth >= MAX_DEPTH {
                return Err(format!("arrays nested deeper than {MAX_DEPTH}"));
            }
            let mut items = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(1024));
            let mut at = after;
            for _ in 0..n {
                match parse_at(&buf[at..], depth + 1)? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Reply::Array(Some(items)), at)))
        }
        other => Err(format!("unexpected reply type byte {other:#x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    #[test]
    fn parses_every_reply_type_and_waits_for_incomplete_input() {
        let input = b"*3\r\n:1\r\n$3\r\nabc\r\n$-1\r\n+OK\r\n-ERR x\r\n";
        let (r, used) = parse(input).unwrap().unwrap();
        assert_eq!(
            r,
            Reply::Array(Some(vec![
                Reply::Int(1),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Bulk(None)
            ]))
        );
        let (r, used2) = parse(&input[used..]).unwrap().unwrap();
        assert_eq!(r, Reply::Simple("OK".into()));
        assert_eq!(
            parse(&input[used + used2..]).unwrap().unwrap().0,
            Reply::Error("ERR x".into())
        );
        for cut in 1..used {
            assert_eq!(parse(&input[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b":abc\r\n").is_err());
    }

    #[test]
    fn huge_or_malformed_lengths_are_errors_not_panics() {
        let max = format!("${}\r\nx", i64::MAX);
        assert!(parse(max.as_bytes()).is_err());
        let near = format!("${}\r\n", usize::MAX - 1);
        assert!(parse(near.as_bytes()).is_err());
        assert!(parse(b"$536870913\r\n").is_err());
        assert_eq!(
            parse(b"$536870912\r\n").unwrap(),
            None,
            "allowed, incomplete"
        );
        assert!(parse(b"\r\n").is_err());
        assert!(parse(b"$3\r\nabcXY").is_err());
        let deep = "*1\r\n".repeat(10_000) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
        let long = format!("*{}\r\n:1\r\n", i64::MAX);
        assert_eq!(parse(long.as_bytes()).unwrap(), None);
    }

    /// Encodes a reply the way a server does.
    fn wire(reply: &Reply, out: &mut Vec<u8>) {
        match reply {
            Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(b)) => {
                header(out, b'$', b.len());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(Some(items)) => {
                header(out, b'*', items.len());
                for i in items {
                    wire(i, out);
                }
            }
        }
    }

    fn reply_strategy() -> impl Strategy<Value = Reply> {
        let line = "[a-zA-Z0-9 :_-]{0,12}";
        let leaf = prop_oneof![
            any::<i64>().prop_map(Reply::Int),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(Reply::Bulk),
            line.prop_map(Reply::Simple),
            line.prop_map(Reply::Error),
            Just(Reply::Array(None)),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            proptest::collection::vec(inner, 0..6).prop_map(|v| Reply::Array(Some(v)))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Whatever the server (or a man in the middle) sends, the parser answers with a
        /// reply, "incomplete" or an error.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        #[test]
        fn bytes_shaped_like_replies_never_panic(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(b"\r\n".to_vec()),
                    "[-+:$*?]-?[0-9]{0,20}".prop_map(String::into_bytes),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ],
                0..24,
            )
        ) {
            let bytes = parts.concat();
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        #[test]
        fn valid_frames_split_anywhere_parse_back_whole(
            replies in proptest::collection::vec(reply_strategy(), 1..4),
            cut in any::<proptest::sample::Index>(),
        ) {
            let mut bytes = Vec::new();
            for r in &replies {
                wire(r, &mut bytes);
            }
            // Arbitrary split: the first part alone is incomplete or whole replies, never an
            // error; the rest completes it.
            let cut = cut.index(bytes.len() + 1);
            let mut at = 0;
            let mut parsed = Vec::new();
            while let Some((r, used)) = parse(&bytes[at..cut]).map_err(TestCaseError::fail)? {
                parsed.push(r);
                at += used;
            }
            while at < bytes.len() {
                let (r, used) = parse(&bytes[at..])
                    .map_err(TestCaseError::fail)?
                    .ok_or_else(|| TestCaseError::fail("complete input reported incomplete"))?;
                parsed.push(r);
                at += used;
            }
            prop_assert_eq!(parsed, replies);
        }
    }

    #[cfg(feature = "testkit")]
    mod line {
        use super::super::*;
        use crate::testkit::redis::RedisServer;

        fn pool(server: &RedisServer) -> Arc<Pool> {
            Arc::new(Pool::new(ConnInfo {
                addr: format!("127.0.0.1:{}", server.port()),
                user: None,
                password: None,
                db: 0,
                connect_timeout: Duration::from_secs(5),
                response_timeout: Duration::from_secs(30),
                sentinel: None,
                node_id: None,
                tls: None,
            }))
        }

        fn busy(pool: &Pool) -> (usize, usize) {
            let line = pool.line.lock().unwrap();
            (line.busy, line.waiting.len())
        }

        /// Holds every connection of `pool` for about `secs` (a `BLPOP` on a list nobody
        /// fills), and returns once they are all in use.
        async fn occupy(pool: &Arc<Pool>, secs: &str) -> Vec<tokio::task::JoinHandle<()>> {
            let tasks: Vec<_> = (0..MAX_OPEN)
                .map(|_| {
                    let (p, secs) = (pool.clone(), secs.to_owned());
                    tokio::spawn(async move {
                        let cmd: [&[u8]; 3] = [b"BLPOP", b"nothing", secs.as_bytes()];
                        p.pipeline(&[cmd]).await.unwrap();
                    })
                })
                .collect();
            while busy(pool).0 < MAX_OPEN {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tasks
        }

        /// Thousands of concurrent requests: each gets its own replies, in order, no more
        /// than `MAX_OPEN` connections are opened for them, and the server reads them in
        /// batches (far fewer reads than requests).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn concurrent_requests_get_their_own_replies_over_few_connections() {
            let server = RedisServer::start().expect("redis-server must be installed");
            let pool = pool(&server);
            let tasks: Vec<_> = (0..5000)
                .map(|i| {
                    let pool = pool.clone();
                    tokio::spawn(async move {
                        let (key, value) = (format!("k{i}"), format!("v{i}"));
                        let set: [&[u8]; 3] = [b"SET", key.as_bytes(), value.as_bytes()];
                        let get: [&[u8]; 2] = [b"GET", key.as_bytes()];
                        let replies = pool.pipeline(&[&set[..], &get[..]]).await.unwrap();
                        assert_eq!(
                            replies,
                            vec![
                                Reply::Simple("OK".into()),
                                Reply::Bulk(Some(value.into_bytes()))
                            ]
                        );
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            let info = server.cli(&["INFO"]).unwrap();
            let stat = |name: &str| -> usize {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or_else(|| panic!("{name} in INFO"))
            };
            // The pool's connections and `redis-cli`'s own.
            let connected = stat("connected_clients");
            assert!(connected <= MAX_OPEN + 1, "{connected} connections");
            let reads = stat("total_reads_processed");
            assert!(reads < 2500, "{reads} reads for 5000 requests");
            assert_eq!(busy(&pool), (0, 0));
        }

        /// A request whose caller gives up while it waits in line is never sent, and its
        /// place is gone; the connections come back once their requests are answered.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn requests_given_up_in_line_are_never_sent() {
            let server = RedisServer::start().expect("redis-server must be installed");
            let pool = pool(&server);
            let holders = occupy(&pool, "1").await;
            for _ in 0..10 {
                let incr: [&[u8]; 2] = [b"INCR", b"given-up"];
                let waited =
                    tokio::time::timeout(Duration::from_millis(20), pool.pipeline(&[incr])).await;
                assert!(waited.is_err(), "every connection is in use");
            }
            assert_eq!(
                busy(&pool),
                (MAX_OPEN, 10),
                "the places stay until a batch looks"
            );
            for h in holders {
                h.await.unwrap();
            }
            let get: [&[u8]; 2] = [b"GET", b"given-up"];
            assert_eq!(
                pool.pipeline(&[get]).await.unwrap(),
                vec![Reply::Bulk(None)]
            );
            assert_eq!(busy(&pool), (0, 0));
        }

        /// A connection opened before a `clear` (a failover: it may reach the old master) is
        /// not passed to a request waiting in line, which opens a new one.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_connection_from_before_a_clear_is_not_passed_on() {
            let server = RedisServer::start().expect("redis-server must be installed");
            let pool = pool(&server);
            let id: [&[u8]; 2] = [b"CLIENT", b"ID"];
            let holders: Vec<_> = (0..MAX_OPEN)
                .map(|_| {
                    let p = pool.clone();
                    tokio::spawn(async move {
                        let block: [&[u8]; 3] = [b"BLPOP", b"nothing", b"1"];
                        let r = p.pipeline(&[&id[..], &block[..]]).await.unwrap();
                        r[0].int().unwrap()
                    })
                })
                .collect();
            while busy(&pool).0 < MAX_OPEN {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let waiting = {
                let p = pool.clone();
                tokio::spawn(async move { p.pipeline(&[id]).await.unwrap()[0].int().unwrap() })
            };
            while busy(&pool).1 < 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            pool.clear();
            let mut old = Vec::new();
            for h in holders {
                old.push(h.await.unwrap());
            }
            let new = waiting.await.unwrap();
            assert!(
                !old.contains(&new),
                "connection {new} was opened before the clear"
            );
            assert_eq!(busy(&pool), (0, 0));
        }

        /// A batch whose own caller gives up mid-exchange answers the requests it carried
        /// with an error and frees its slot: nothing waits forever, nothing leaks.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_batch_given_up_mid_exchange_answers_its_riders_and_frees_its_slot() {
            let server = RedisServer::start().expect("redis-server must be installed");
            let pool = pool(&server);
            let holders = occupy(&pool, "1").await;
            // Queued first: its task leads the next batch, whose first command blocks.
            let lead = {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let cmd: [&[u8]; 3] = [b"BLPOP", b"nothing", b"10"];
                    pool.pipeline(&[cmd]).await
                })
            };
            while busy(&pool).1 < 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let rider = {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let cmd: [&[u8]; 1] = [b"PING"];
                    pool.pipeline(&[cmd]).await
                })
            };
            while busy(&pool).1 < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            for h in holders {
                h.await.unwrap();
            }
            // The holders' connections went to the lead (which took the rider along) and
            // back to idle.
            while busy(&pool).0 > 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            lead.abort();
            assert!(lead.await.unwrap_err().is_cancelled());
            let answer = tokio::time::timeout(Duration::from_secs(5), rider)
                .await
                .expect("the rider is answered")
                .unwrap();
            assert!(answer.is_err(), "{answer:?}");
            assert_eq!(busy(&pool), (0, 0));
            let ping: [&[u8]; 1] = [b"PING"];
            assert_eq!(
                pool.pipeline(&[ping]).await.unwrap(),
                vec![Reply::Simple("PONG".into())]
            );
        }
    }

    #[test]
    fn encodes_binary_safe_bulk_strings() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"a\r\nb", b""]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$4\r\na\r\nb\r\n$0\r\n\r\n");
    }
}
