//! Unary KV calls (range, put, transactions) over one HTTP/2 connection driven by `h2`
//! directly, for plain-text endpoints.
//!
//! A lock cycle is two transactions, and on a small machine a call's cost is mostly the tasks
//! it passes through: a tonic channel hands each request to its buffer's worker task, which
//! hands it to hyper's connection task, which spawns a task per request to forward the answer.
//! Here the calling task puts the request into the h2 connection itself and reads the answer
//! itself; only h2's connection task (the socket) is between it and the server. Streams
//! (watches, lease keep-alives), TLS and the rare lease calls stay on tonic.
//!
//! The connection goes to one member at a time, the next one in turn whenever it is made
//! again: after it failed, after a call that could not be answered in time, and after a member
//! answered that it cannot serve (`Unavailable`, such as losing its leader).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_TYPE, TE};
use http::{Request, Uri};
use prost::Message;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::{Code, Status};

use super::rpc_error::RpcError;
use crate::backends::contenders::Locked;

/// A call that takes this long before it is dropped (its deadline) leaves the connection
/// suspect: the next call makes a new one.
const SUSPECT_AFTER: Duration = Duration::from_secs(1);

/// The KV methods called here.
#[derive(Clone, Copy)]
pub(super) enum Method {
    Range,
    Put,
    Txn,
}

impl Method {
    fn path(self) -> &'static str {
        match self {
            Method::Range => "/etcdserverpb.KV/Range",
            Method::Put => "/etcdserverpb.KV/Put",
            Method::Txn => "/etcdserverpb.KV/Txn",
        }
    }
}

/// One HTTP/2 connection to a member, and the URIs of the methods on it.
#[derive(Clone)]
struct Conn {
    send: h2::client::SendRequest<Bytes>,
    uris: [Uri; 3],
    /// Which connection this is (a failed call drops only the one it used).
    generation: usize,
}

/// Unary calls on a connection made on first use and again after a failure.
pub(super) struct Unary {
    hosts: Vec<String>,
    connect_timeout: Duration,
    current: Mutex<Option<Conn>>,
    /// Serializes the making of connections.
    connecting: tokio::sync::Mutex<()>,
    made: AtomicUsize,
}

impl Unary {
    pub(super) fn new(hosts: Vec<String>, connect_timeout: Duration) -> Arc<Unary> {
        Arc::new(Unary {
            hosts,
            connect_timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            // Processes start at different members, as a balanced channel would spread them.
            made: AtomicUsize::new(first_member()),
        })
    }

    fn cached(&self) -> Option<Conn> {
        self.current.locked().clone()
    }

    /// Forgets connection `generation` (if still the current one).
    fn drop_conn(&self, generation: usize) {
        let mut cur = self.current.locked();
        if cur.as_ref().is_some_and(|c| c.generation == generation) {
            *cur = None;
        }
    }

    async fn conn(&self) -> Result<Conn, RpcError> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let _one = self.connecting.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let generation = self.made.fetch_add(1, Ordering::Relaxed);
        let host = &self.hosts[generation % self.hosts.len()];
        let connect = async {
            let tcp = TcpStream::connect(host.as_str()).await?;
            tcp.set_nodelay(true)?;
            // hyper's windows (what the tonic channel used): a large answer (a long queue)
            // comes without waiting for window updates.
            let (send, conn) = h2::client::Builder::new()
                .initial_window_size(2 << 20)
                .initial_connection_window_size(5 << 20)
                .handshake(tcp)
                .await
                .map_err(std::io::Error::other)?;
            Ok::<_, std::io::Error>((send, conn))
        };
        let (send, conn) = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(c)) => c,
            // Worded as a connect error, so that the call is tried again (on the next member).
            Ok(Err(e)) => {
                return Err(Status::unavailable(format!("tcp connect error to {host}: {e}")).into())
            }
            Err(_) => {
                return Err(Status::unavailable(format!("connect to {host} timed out")).into())
            }
        };
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "etcd KV connection closed");
            }
        });
        let uri = |m: Method| {
            Uri::builder()
                .scheme("http")
                .authority(host.as_str())
                .path_and_query(m.path())
                .build()
                .map_err(|e| RpcError::Config(format!("etcd endpoint {host}: {e}")))
        };
        let c = Conn {
            send,
            uris: [uri(Method::Range)?, uri(Method::Put)?, uri(Method::Txn)?],
            generation,
        };
        *self.current.locked() = Some(c.clone());
        Ok(c)
    }

    /// Sends `req` to `method` with the authentication `token`, and decodes the answer.
    pub(super) async fn call<Q: Message, A: Message + Default>(
        &self,
        method: Method,
        req: &Q,
        token: Option<AsciiMetadataValue>,
    ) -> Result<A, RpcError> {
        let c = self.conn().await?;
        let mut guard = Suspect {
            unary: self,
            generation: c.generation,
            since: Instant::now(),
            armed: true,
        };
        let answer = exchange(c, method, req, token).await;
        guard.armed = false;
        match answer {
            Ok(a) => Ok(a),
            Err(Failure::Status(s)) => {
                if s.code() == Code::Unavailable {
                    self.drop_conn(guard.generation);
                }
                Err(s.into())
            }
            Err(Failure::Transport(msg)) => {
                self.drop_conn(guard.generation);
                Err(Status::unavailable(msg).into())
            }
        }
    }
}

/// A member to start at that differs between processes and instances.
fn first_member() -> usize {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos as usize) ^ (std::process::id() as usize)
}

/// Drops the connection of a call that is dropped unfinished after [`SUSPECT_AFTER`].
struct Suspect<'a> {
    unary: &'a Unary,
    generation: usize,
    since: Instant,
    armed: bool,
}

impl Drop for Suspect<'_> {
    fn drop(&mut self) {
        if self.armed && self.since.elapsed() >= SUSPECT_AFTER {
            self.unary.drop_conn(self.generation);
        }
    }
}

enum Failure {
    /// The server's answer.
    Status(Status),
    /// The connection failed (the request may or may not have been applied).
    Transport(String),
}

fn transport(e: h2::Error) -> Failure {
    Failure::Transport(format!("etcd KV stream failed: {e}"))
}

async fn exchange<Q: Message, A: Message + Default>(
    c: Conn,
    method: Method,
    req: &Q,
    token: Option<AsciiMetadataValue>,
) -> Result<A, Failure> {
    let len = req.encoded_len();
    let mut body = BytesMut::with_capacity(5 + len);
    body.put_u8(0);
    body.put_u32(
        u32::try_from(len)
            .map_err(|_| Failure::Status(Status::out_of_range("request too large")))?,
    );
    req.encode(&mut body)
        .map_err(|e| Failure::Status(Status::internal(e.to_string())))?;
    let mut builder = Request::post(c.uris[method as usize].clone())
        .header(CONTENT_TYPE, HeaderValue::from_static("application/grpc"))
        .header(TE, HeaderValue::from_static("trailers"))
        // As every call of the tonic client: a member cut off from the leader refuses.
        .header("hasleader", HeaderValue::from_static("true"));
    if let Some(t) = token {
        builder = builder.header(
            "token",
            HeaderValue::from_bytes(t.as_encoded_bytes())
                .map_err(|e| Failure::Status(Status::internal(e.to_string())))?,
        );
    }
    let request = builder
        .body(())
        .map_err(|e| Failure::Status(Status::internal(e.to_string())))?;
    let mut send = c.send.ready().await.map_err(transport)?;
    let (response, mut stream) = send.send_request(request, false).map_err(transport)?;
    stream.send_data(body.freeze(), true).map_err(transport)?;
    let response = response.await.map_err(transport)?;
    let (head, mut recv) = response.into_parts();
    if let Some(s) = Status::from_header_map(&head.headers) {
        if s.code() != Code::Ok {
            // A trailers-only answer: the status is in the headers.
            return Err(Failure::Status(s));
        }
    }
    if head.status != http::StatusCode::OK {
        return Err(Failure::Transport(format!(
            "etcd answered HTTP status {}",
            head.status
        )));
    }
    // The answer is mostly one DATA frame, kept as it came; more are copied into one buffer.
    let mut data = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(transport)?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        match &mut joined {
            Some(j) => j.extend_from_slice(&chunk),
            None if data.is_empty() => data = chunk,
            None => {
                let mut j = BytesMut::from(&data[..]);
                j.extend_from_slice(&chunk);
                joined = Some(j);
            }
        }
    }
    let mut data = joined.map_or(data, BytesMut::freeze);
    let trailers = recv.trailers().await.map_err(transport)?;
    if let Some(s) = trailers.as_ref().and_then(Status::from_header_map) {
        if s.code() != Code::Ok {
            return Err(Failure::Status(s));
        }
    }
    if data.len() < 5 {
        return Err(Failure::Status(Status::internal("etcd sent no message")));
    }
    if data.get_u8() != 0 {
        return Err(Failure::Status(Status::internal(
            "etcd sent a compressed message",
        )));
    }
    let n = data.get_u32() as usize;
    if data.len() < n {
        return Err(Failure::Status(Status::internal(
            "etcd sent a short message",
        )));
    }
    A::decode(data.slice(..n)).map_err(|e| Failure::Status(Status::internal(e.to_string())))
}
