//! A small etcd v3 gRPC client: exactly what the backend needs, over tonic.
//!
//! - One channel balanced over all endpoints of the URL (tonic's `balance_list`, as etcd's own
//!   clients do): a request that cannot connect to one member goes to another, within the
//!   request's time ([`with_retry`]).
//! - Every call carries `hasleader: true` (a member cut off from the leader refuses instead of
//!   serving stale data) and, with a user, the `token` of the last `Authenticate`. A call the
//!   server refuses because the token is invalid or expired logs in again once and is repeated.
//! - KV (range, put, transactions), leases (grant, revoke, time to live, the keep-alive
//!   stream), the watch stream and the member status.
//! - Errors map onto the crate's [`Error`] in [`map_err`]: transport failures, deadlines and
//!   unavailable members are retryable, refusals (authentication, bad requests) permanent.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use super::pb::{
    watch_create_request, watch_request, AuthClient, AuthenticateRequest, KvClient, LeaseClient,
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseRevokeRequest, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, MaintenanceClient,
    PutRequest, PutResponse, RangeRequest, RangeResponse, StatusRequest, TxnRequest, TxnResponse,
    WatchCancelRequest, WatchClient, WatchCreateRequest, WatchRequest, WatchResponse,
};
use super::rpc_error::{is_connect_error, Result, RpcError};
use super::unary::{Method, Unary};

/// Runs `op` within `limit`, again as long as it fails to connect (see [`is_connect_error`]).
pub(super) async fn with_retry<T, F, Fut>(limit: Duration, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + limit;
    let mut tries = 0u64;
    loop {
        match tokio::time::timeout_at(deadline, op()).await {
            Err(_) => return Err(RpcError::TimedOut),
            Ok(Err(e)) if is_connect_error(&e) && Instant::now() < deadline => {
                tries += 1;
                if tries > 3 {
                    let pause = Duration::from_millis(10 * tries.min(20));
                    tokio::time::sleep_until(deadline.min(Instant::now() + pause)).await;
                }
            }
            Ok(r) => return r,
        }
    }
}

/// The TLS material of an `etcds://` connection (read only with the `etcd-tls` feature; without
/// it `etcds://` is refused before any is gathered).
#[derive(Default)]
#[cfg_attr(not(feature = "etcd-tls"), allow(dead_code))]
pub(super) struct TlsSettings {
    /// PEM certificate(s) of the servers' authority; `None`: the Mozilla roots.
    pub(super) ca_pem: Option<Vec<u8>>,
    /// A client certificate and its private key (PEM).
    pub(super) identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Where and how to connect.
pub(super) struct Settings {
    /// `host:port` of each member.
    pub(super) hosts: Vec<String>,
    /// `Some` for TLS.
    pub(super) tls: Option<TlsSettings>,
    pub(super) user: Option<(String, String)>,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
}

type Token = Arc<RwLock<Option<AsciiMetadataValue>>>;

/// Adds the leader requirement and the authentication token to every request.
#[derive(Clone)]
pub(super) struct Headers {
    token: Option<Token>,
}

impl tonic::service::Interceptor for Headers {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, Status> {
        if let Some(token) = &self.token {
            if let Some(t) = token.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
                req.metadata_mut().insert("token", t.clone());
            }
        }
        req.metadata_mut()
            .insert("hasleader", AsciiMetadataValue::from_static("true"));
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Headers>;

/// Logging in, and again when the server no longer takes the token.
struct Auth {
    client: AuthClient<Svc>,
    user: String,
    password: String,
    token: Token,
    /// Serializes logins, so that calls that find the token expired at once log in once.
    refresh: tokio::sync::Mutex<()>,
}

impl Auth {
    fn current(&self) -> Option<AsciiMetadataValue> {
        self.token.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn login(&self) -> Result<()> {
        let req = AuthenticateRequest {
            name: self.user.clone(),
            password: self.password.clone(),
        };
        let resp = self.client.clone().authenticate(req).await?.into_inner();
        let token = AsciiMetadataValue::try_from(resp.token.as_str())
            .map_err(|_| RpcError::Config("the server sent an unusable token".into()))?;
        *self.token.write().unwrap_or_else(|e| e.into_inner()) = Some(token);
        Ok(())
    }

    /// Logs in again unless another call did so since `stale` was sent.
    async fn refresh(&self, stale: Option<AsciiMetadataValue>) -> Result<()> {
        let _one = self.refresh.lock().await;
        if self.current() != stale {
            return Ok(());
        }
        self.login().await
    }
}

/// What the server says when a token is invalid or expired (`rpctypes.ErrInvalidAuthToken`).
/// It usually comes with `Unauthenticated`; services etcd runs on its in-process client lose
/// the code and keep only the message.
fn is_invalid_auth_token(s: &Status) -> bool {
    match s.code() {
        Code::Unauthenticated => true,
        Code::Unknown => s.message() == "etcdserver: invalid auth token",
        _ => false,
    }
}

/// A connection to an etcd cluster; clones share it.
#[derive(Clone)]
pub(super) struct Client {
    kv: KvClient<Svc>,
    watch: WatchClient<Svc>,
    lease: LeaseClient<Svc>,
    maintenance: MaintenanceClient<Svc>,
    auth: Option<Arc<Auth>>,
    /// KV calls without tonic's tasks in between, on plain-text endpoints (see `unary.rs`).
    unary: Option<Arc<Unary>>,
    request_timeout: Duration,
}

fn endpoint(host: &str, settings: &Settings) -> Result<Endpoint> {
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let ep = Endpoint::from_shared(format!("{scheme}://{host}"))
        .map_err(|e| RpcError::Config(format!("etcd endpoint {host}: {e}")))?
        .connect_timeout(settings.connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(false);
    match &settings.tls {
        None => Ok(ep),
        #[cfg(feature = "etcd-tls")]
        Some(tls) => {
            use tonic::transport::{Certificate, ClientTlsConfig, Identity};
            let mut config = ClientTlsConfig::new();
            config = match &tls.ca_pem {
                Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
                None => config.with_webpki_roots(),
            };
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            ep.tls_config(config)
                .map_err(|e| RpcError::Config(format!("etcd TLS settings: {e}")))
        }
        #[cfg(not(feature = "etcd-tls"))]
        Some(_) => Err(RpcError::Config(
            "etcds:// (TLS) needs distlock's cargo feature `etcd-tls`".into(),
        )),
    }
}

/// The request stream of a bidirectional call, fed through `rx`.
fn requests<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

impl Client {
    /// Sets up the channel and, with a user, logs in (retried within the connect timeout).
    /// Connections are made on first use.
    pub(super) async fn connect(settings: Settings) -> Result<Client> {
        let endpoints = settings
            .hosts
            .iter()
            .map(|h| endpoint(h, &settings))
            .collect::<Result<Vec<_>>>()?;
        let channel = Channel::balance_list(endpoints.into_iter());
        let token: Token = Arc::new(RwLock::new(None));
        let headers = Headers {
            token: settings.user.as_ref().map(|_| token.clone()),
        };
        let auth = settings.user.map(|(user, password)| {
            Arc::new(Auth {
                // `Authenticate` is how the token is obtained: it carries none.
                client: AuthClient::with_interceptor(channel.clone(), Headers { token: None }),
                user,
                password,
                token,
                refresh: tokio::sync::Mutex::new(()),
            })
        });
        if let Some(auth) = &auth {
            with_retry(settings.connect_timeout, || auth.login()).await?;
        }
        let unary = match settings.tls {
            None => Some(Unary::new(settings.hosts.clone(), settings.connect_timeout)),
            Some(_) => None,
        };
        Ok(Client {
            kv: KvClient::with_interceptor(channel.clone(), headers.clone()),
            watch: WatchClient::with_interceptor(channel.clone(), headers.clone()),
            lease: LeaseClient::with_interceptor(channel.clone(), headers.clone()),
            maintenance: MaintenanceClient::with_interceptor(channel, headers),
            auth,
            unary,
            request_timeout: settings.request_timeout,
        })
    }

    /// The authentication token of the next call, if any.
    fn token(&self) -> Option<AsciiMetadataValue> {
        self.auth.as_ref().and_then(|a| a.current())
    }

    /// Runs `op` once, and once more after logging in again if the server refused the token.
    async fn authed<T, F, Fut>(&self, op: &F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let Some(auth) = &self.auth else {
            return op().await;
        };
        let stale = auth.current();
        match op().await {
            Err(RpcError::Status(s)) if is_invalid_auth_token(&s) => {
                auth.refresh(stale).await?;
                op().await
            }
            r => r,
        }
    }

    /// `op` within `limit`, with the retries of [`with_retry`] and a new login when needed.
    async fn call<T, F, Fut>(&self, limit: Duration, op: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        with_retry(limit, || self.authed(&op)).await
    }

    /// The status of a member: one request that proves the address (and the login) work.
    pub(super) async fn status(&self, limit: Duration) -> Result<()> {
        self.call(limit, || {
            let mut c = self.maintenance.clone();
            async move { Ok(c.status(StatusRequest {}).await.map(drop)?) }
        })
        .await
    }

    pub(super) async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        if let Some(u) = &self.unary {
            return self
                .call(self.request_timeout, || {
                    u.call(Method::Range, &req, self.token())
                })
                .await;
        }
        self.call(self.request_timeout, || {
            let (mut c, req) = (self.kv.clone(), req.clone());
            async move { Ok(c.range(req).await?.into_inner()) }
        })
        .await
    }

    pub(super) async fn put(&self, req: PutRequest) -> Result<()> {
        if let Some(u) = &self.unary {
            let put = || u.call::<_, PutResponse>(Method::Put, &req, self.token());
            return self.call(self.request_timeout, put).await.map(drop);
        }
        self.call(self.request_timeout, || {
            let (mut c, req) = (self.kv.clone(), req.clone());
            async move { Ok(c.put(req).await.map(drop)?) }
        })
        .await
    }

    pub(super) async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        if let Some(u) = &self.unary {
            return self
                .call(self.request_timeout, || {
                    u.call(Method::Txn, &req, self.token())
                })
                .await;
        }
        self.call(self.request_timeout, || {
            let (mut c, req) = (self.kv.clone(), req.clone());
            async move { Ok(c.txn(req).await?.into_inner()) }
        })
        .await
    }

    pub(super) async fn lease_grant(&self, ttl: i64) -> Result<LeaseGrantResponse> {
        self.call(self.request_timeout, || {
            let mut c = self.lease.clone();
            async move {
                let req = LeaseGrantRequest { ttl, id: 0 };
                Ok(c.lease_grant(req).await?.into_inner())
            }
        })
        .await
    }

    pub(super) async fn lease_revoke(&self, id: i64) -> Result<()> {
        self.call(self.request_timeout, || {
            let mut c = self.lease.clone();
            async move { Ok(c.lease_revoke(LeaseRevokeRequest { id }).await.map(drop)?) }
        })
        .await
    }

    pub(super) async fn lease_time_to_live(&self, id: i64) -> Result<LeaseTimeToLiveResponse> {
        self.call(self.request_timeout, || {
            let mut c = self.lease.clone();
            async move {
                let req = LeaseTimeToLiveRequest { id, keys: false };
                Ok(c.lease_time_to_live(req).await?.into_inner())
            }
        })
        .await
    }

    /// Opens a keep-alive stream for lease `id` and sends the first keep-alive; fails with
    /// [`RpcError::LeaseNotFound`] when the server no longer knows the lease.
    pub(super) async fn lease_keep_alive(&self, id: i64) -> Result<(LeaseKeeper, KeepAliveStream)> {
        self.call(self.request_timeout, || {
            let mut c = self.lease.clone();
            async move {
                let (tx, rx) = mpsc::channel(100);
                let keeper = LeaseKeeper { id, tx };
                keeper.keep_alive().await?;
                let mut stream = c.lease_keep_alive(requests(rx)).await?.into_inner();
                match stream.message().await? {
                    Some(r) if r.ttl > 0 => Ok((keeper, stream)),
                    Some(_) => Err(RpcError::LeaseNotFound),
                    None => Err(RpcError::Closed(
                        "the lease keep-alive stream closed at once",
                    )),
                }
            }
        })
        .await
    }

    /// Opens a watch stream with a first watch of `key` (see [`WatchSender::watch`]) from
    /// the current revision on; the server confirms it (`created`) on the stream.
    pub(super) async fn watch(
        &self,
        key: Vec<u8>,
        range_end: Vec<u8>,
        from: i64,
    ) -> Result<(WatchSender, WatchStream)> {
        self.call(self.request_timeout, || {
            let (mut c, key, range_end) = (self.watch.clone(), key.clone(), range_end.clone());
            async move {
                let (tx, rx) = mpsc::channel(100);
                let sender = WatchSender { tx };
                sender.watch(key, range_end, from).await?;
                let stream = c.watch(requests(rx)).await?.into_inner();
                Ok((sender, stream))
            }
        })
        .await
    }
}

/// The answers of a lease keep-alive stream.
pub(super) type KeepAliveStream = Streaming<LeaseKeepAliveResponse>;

/// The sending half of a lease keep-alive stream.
pub(super) struct LeaseKeeper {
    id: i64,
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
}

impl LeaseKeeper {
    /// Sends one keep-alive; the answer comes on the stream.
    pub(super) async fn keep_alive(&self) -> Result<()> {
        self.tx
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| RpcError::Closed("the lease keep-alive stream closed"))
    }
}

/// The events and confirmations of a watch stream.
pub(super) type WatchStream = Streaming<WatchResponse>;

/// The sending half of a watch stream: more watches on it, and cancellations.
pub(super) struct WatchSender {
    tx: mpsc::Sender<WatchRequest>,
}

impl WatchSender {
    /// Watches `key` from the server's current revision on; with a `range_end`, the
    /// deletions of the keys in `[key, range_end)` (puts filtered out by the server).
    /// Watches `[key, range_end)` from revision `from` on (0: from the server's current one).
    pub(super) async fn watch(&self, key: Vec<u8>, range_end: Vec<u8>, from: i64) -> Result<()> {
        let filters = if range_end.is_empty() {
            Vec::new()
        } else {
            vec![watch_create_request::FilterType::Noput as i32]
        };
        let create = WatchCreateRequest {
            key,
            range_end,
            filters,
            start_revision: from.max(0),
            ..WatchCreateRequest::default()
        };
        self.send(watch_request::RequestUnion::CreateRequest(create))
            .await
    }

    pub(super) async fn cancel(&self, watch_id: i64) -> Result<()> {
        self.send(watch_request::RequestUnion::CancelRequest(
            WatchCancelRequest { watch_id },
        ))
        .await
    }

    async fn send(&self, r: watch_request::RequestUnion) -> Result<()> {
        self.tx
            .send(WatchRequest {
                request_union: Some(r),
            })
            .await
            .map_err(|_| RpcError::Closed("the watch stream closed"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::rpc_error::{is_lease_not_found, map_err};
    use super::*;
    use crate::error::Error;

    #[test]
    fn errors_map_onto_the_crates() {
        let e = map_err(RpcError::Status(Status::unavailable(
            "etcdserver: no leader",
        )));
        assert!(e.is_retryable(), "{e:?}");
        let e = map_err(RpcError::Status(Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        )));
        assert!(
            !e.is_retryable() && e.to_string().contains("authentication"),
            "{e}"
        );
        let e = map_err(RpcError::Status(Status::permission_denied("x")));
        assert!(matches!(e, Error::Backend { .. }), "{e:?}");
        let e = map_err(RpcError::Status(Status::out_of_range("too large")));
        assert!(matches!(e, Error::Backend { .. }), "{e:?}");
        assert!(map_err(RpcError::TimedOut).is_retryable());
        assert!(map_err(RpcError::Status(Status::deadline_exceeded("slow"))).is_retryable());
        assert!(matches!(
            map_err(RpcError::Config("bad".into())),
            Error::InvalidConfig(_)
        ));
        assert!(is_connect_error(&RpcError::Status(Status::unavailable(
            "tcp connect error: Connection refused (os error 111)"
        ))));
        assert!(!is_connect_error(&RpcError::Status(Status::unavailable(
            "etcdserver: no leader"
        ))));
        assert!(is_lease_not_found(&RpcError::Status(Status::not_found(
            "etcdserver: requested lease not found"
        ))));
        assert!(is_invalid_auth_token(&Status::unauthenticated("x")));
        assert!(is_invalid_auth_token(&Status::unknown(
            "etcdserver: invalid auth token"
        )));
        assert!(!is_invalid_auth_token(&Status::unknown("other")));
    }
}
