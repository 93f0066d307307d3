//! `distlock serve`: the configured backend over HTTP/1.1 (docs/SERVE.md), with a live page.
//!
//! - `routes`: the router, authentication, bad input; `sites`: the `Host`, `Origin` and
//!   content-type checks that keep other sites' pages out;
//! - `holds`: holds taken over HTTP, each a lease its caller owns; `expiry`: when their
//!   leases end;
//! - `events`: what the page shows, the timeline and the server-sent events;
//! - `listing`: `GET /v1/locks`, the backend's list with this service's holds beside it;
//! - `demo`: the articles' demonstration, started from the page or `POST /demo`;
//! - `page`, `openapi`, `metrics`, `tls`: the page's assets, `/v1/openapi.json`, `/metrics`,
//!   the certificate files.
//!
//! # Shutdown
//! On SIGTERM, SIGINT or SIGHUP the service stops accepting connections, answers 503 to
//! requests still arriving on open ones, ends the waits of waiting requests (503), releases
//! every open hold on the backend (a `released` event each), stops the demonstration (its
//! holder releases, and the service waits for it), ends the event streams and gives
//! requests in flight up to [`DRAIN`] to finish. A caller's next request for a hold it had
//! then answers 410 (the token is unknown, to this process and to the next one): its lock is
//! free and somebody else may have it.

mod demo;
mod events;
mod expiry;
mod holds;
mod listing;
mod metrics;
mod openapi;
mod page;
mod routes;
mod sites;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::Either;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Failure, Global, EXIT_BACKEND};
use crate::signals::Signals;
use crate::util::{out, say};
use events::Board;
use holds::Holds;

/// How long requests in flight may take to finish after a shutdown signal.
pub const DRAIN: Duration = Duration::from_secs(5);

/// What `serve` was asked to do.
#[derive(Debug)]
pub struct ServeRequest {
    pub listen: SocketAddr,
    pub token_file: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Host names requests may name besides the addresses listened on.
    pub allow_hosts: Vec<String>,
    /// Listen beyond loopback without a token, on purpose.
    pub open: bool,
}

/// What every handler shares.
pub struct Service {
    holds: Holds,
    board: Board,
    token: Option<String>,
    sites: sites::Sites,
    demos: demo::Demos,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    options: distlock::RegistryOptions,
    stopping: watch::Receiver<bool>,
}

impl Service {
    fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }
}

/// An error answer: a status and `{"error": message}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
    fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }
    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    fn gone() -> Self {
        Self::new(
            StatusCode::GONE,
            "the hold is gone (released, or its lease ended)",
        )
    }
    fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the service is shutting down",
        )
    }
}

impl From<distlock::Error> for ApiError {
    fn from(e: distlock::Error) -> Self {
        use distlock::Error;
        let status = match &e {
            Error::InvalidKey(_) | Error::InvalidConfig(_) => StatusCode::BAD_REQUEST,
            Error::NotAcquired { .. } => StatusCode::CONFLICT,
            Error::LockLost { .. } | Error::NotHeld { .. } => StatusCode::GONE,
            Error::Unsupported { .. } => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(openapi::ErrorBody {
            error: self.message,
        });
        (self.status, body).into_response()
    }
}

/// Runs the service until a termination signal; returns the exit status.
pub async fn serve(global: &Global, req: ServeRequest) -> Result<i32, Failure> {
    let token = match &req.token_file {
        Some(path) => Some(read_token(path)?),
        None => None,
    };
    if token.is_none() && !req.listen.ip().is_loopback() && !req.open {
        return Err(Failure::usage(format!(
            "refusing to listen on {} without --token-file: anyone who can reach it could take and release locks (give --token-file FILE, or --open if it is meant to be open)",
            req.listen
        )));
    }
    let tls = match (&req.tls_cert, &req.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        (None, None) => None,
        _ => return Err(Failure::usage("--tls-cert and --tls-key go together")),
    };
    let sites = sites::Sites::new(&req.allow_hosts, tls.is_some()).map_err(Failure::usage)?;
    let metrics = metrics::install()?;
    let options = global.options()?;
    let url = service_url(&global.backend_url()?);
    let backend = distlock::connect(&url).await.map_err(|e| Failure {
        code: EXIT_BACKEND,
        message: format!("{e} (backend {})", distlock::redact(&url)),
    })?;
    let registry = distlock::LockRegistry::from_backend(
        backend,
        options.clone().with_renew(false).with_max_local_handoffs(0),
    )?;
    let listener = TcpListener::bind(req.listen).await.map_err(|e| Failure {
        code: EXIT_BACKEND,
        message: format!("cannot listen on {}: {e}", req.listen),
    })?;
    let local = listener.local_addr().map_err(|e| Failure {
        code: EXIT_BACKEND,
        message: format!("cannot read the listening address: {e}"),
    })?;

    let (stop, stopping) = watch::channel(false);
    let board = Board::default();
    let service = Arc::new(Service {
        holds: Holds::new(registry, board.clone(), stopping.clone()),
        board,
        token,
        sites,
        demos: demo::Demos::default(),
        metrics,
        options,
        stopping,
    });
    let router = routes::router(service.clone());
    let scheme = if tls.is_some() { "https" } else { "http" };
    // Tests and scripts read this line to learn the port of `--listen 127.0.0.1:0`.
    out(&format!("distlock serve: listening on {scheme}://{local}"));

    let mut signals = Signals::install();
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::debug!(error = %e, "accept failed");
                        // Out of descriptors and the like: give it a moment to pass.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                // The address the client reached: what an address in its `Host` must be.
                let arrived = tcp.local_addr().unwrap_or(local);
                let owner = distlock::Owner::new(format!("http {peer}")).ok().map(holds::Peer);
                let routed = TowerToHyperService::new(router.clone());
                let gate = service.clone();
                let known = sites::KnownHost::default();
                let service = hyper::service::service_fn(move |request| {
                    let answer = match routes::refused(&gate, &request, arrived, &known) {
                        Some(refused) => Either::Left(std::future::ready(Ok::<_, std::convert::Infallible>(refused))),
                        None => Either::Right(match routes::hot_route(request.method(), request.uri().path()) {
                            Some(call) => Either::Left(futures_util::FutureExt::map(
                                routes::hot(gate.clone(), call, request),
                                Ok,
                            )),
                            None => Either::Right(hyper::service::Service::call(&routed, request)),
                        }),
                    };
                    async move {
                        let response = answer.await;
                        if let Ok(r) = &response {
                            metrics::request(r.status().as_u16());
                        }
                        response
                    }
                });
                let watcher = graceful.watcher();
                let tls = tls.clone();
                // The connection's requests are served in its task: the default owner is there
                    // for them without a request extension (a map allocated for each request).
                tokio::spawn(holds::PEER.scope(owner, async move {
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    // With a timer, hyper drops clients that trickle their headers (30 s).
                    builder.timer(hyper_util::rt::TokioTimer::new());
                    let result = match tls {
                        None => {
                            let conn = builder.serve_connection(TokioIo::new(tcp), service);
                            watcher.watch(conn).await
                        }
                        Some(acceptor) => match acceptor.accept(tcp).await {
                            Ok(stream) => {
                                let conn = builder.serve_connection(TokioIo::new(stream), service);
                                watcher.watch(conn).await
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "TLS handshake failed");
                                return;
                            }
                        },
                    };
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                }));
            }
            sig = signals.recv() => {
                tracing::debug!(signal = sig, "shutting down");
                break;
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    tokio::join!(service.holds.release_all(), service.demos.finish(DRAIN));
    service.board.close();
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        say("serve: requests still open after the drain time were cut off");
    }
    // Callers cut off while waiting left their attempts in flight and their queue places to
    // background tasks, which the runtime's end would drop, leaving the keys held or queued.
    if !service.holds.registry().flush(DRAIN).await {
        say("serve: giving back abandoned attempts timed out; their leases will expire");
    }
    Ok(0)
}

/// The bearer token: the file's content without surrounding white space.
fn read_token(path: &PathBuf) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(Failure::usage(format!(
            "the token file {} must hold one word",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// The connections to a `redis://` server that the service opens at most, unless its URL says
/// `max_connections`: the service carries the lock calls of all its clients, and with few
/// connections the calls that arrive together wait in line and go out in one write, so that
/// the service and the server read and write once for several calls (measured in
/// `bench/http/README.md`, "A small Redis pool for the service").
const SERVICE_REDIS_CONNECTIONS: usize = 4;

/// `url`, with `max_connections=`[`SERVICE_REDIS_CONNECTIONS`] added to a `redis://` URL that
/// does not set it.
fn service_url(url: &str) -> String {
    let plain_redis = url
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("redis://"));
    let query = url.split_once('?').map(|(_, q)| q);
    let set = query.is_some_and(|q| {
        q.split('&')
            .any(|p| p.split('=').next() == Some("max_connections"))
    });
    if !plain_redis || set {
        return url.to_owned();
    }
    let join = match query {
        None => "?",
        Some("") => "",
        Some(q) if q.ends_with('&') => "",
        Some(_) => "&",
    };
    format!("{url}{join}max_connections={SERVICE_REDIS_CONNECTIONS}")
}

#[cfg(test)]
mod tests {
    use super::service_url;

    #[test]
    fn a_redis_url_gets_a_small_pool_unless_it_sets_one() {
        let cases = [
            ("redis://h:6379", "redis://h:6379?max_connections=4"),
            ("REDIS://h/2", "REDIS://h/2?max_connections=4"),
            ("redis://h?", "redis://h?max_connections=4"),
            (
                "redis://h?hold_slice=5ms",
                "redis://h?hold_slice=5ms&max_connections=4",
            ),
            (
                "redis://h?max_connections=32",
                "redis://h?max_connections=32",
            ),
            (
                "redis://h?hold_slice=5ms&max_connections=1",
                "redis://h?hold_slice=5ms&max_connections=1",
            ),
            ("rediss://h:6380", "rediss://h:6380"),
            ("redis+sentinel://h/m", "redis+sentinel://h/m"),
            ("memory://", "memory://"),
            ("etcd://h:2379", "etcd://h:2379"),
        ];
        for (given, used) in cases {
            assert_eq!(service_url(given), used, "{given}");
        }
    }
}
