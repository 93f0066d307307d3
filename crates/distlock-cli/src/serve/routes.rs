//! The HTTP surface (docs/SERVE.md): one router, thin handlers that call the holds, the board
//! and the library; bad input becomes 400 with `{"error"}` before anything is taken.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::body::HttpBody;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, Path, Query, State};
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::demo::{DemoRequest, Started};
use super::holds::{AcquireRequest, ExtendRequest, Granted};
use super::openapi::{self, ApiDoc, CommonAnswers, ErrorBody};
use super::{page, ApiError, Service};

/// Largest request body accepted: the bodies are a few small numbers.
const MAX_BODY: usize = 16 * 1024;

/// The whole router over `service`. The API's routes are registered with the operation each
/// handler declares (`#[utoipa::path]`), which also makes the OpenAPI document: the page, its
/// script and the document itself are the only routes outside it. The two requests of every
/// hold, `POST /v1/locks/{key}` and `DELETE /v1/locks/{key}/{token}`, reach their handlers
/// without this router (see [`hot_route`]): a layer added here would not apply to them, so
/// what every request needs belongs in the connection's gate, which both paths pass.
pub fn router(service: Arc<Service>) -> Router {
    let (api, doc) = api();
    let doc = Arc::new(openapi::to_json(&doc));
    api.route("/", get(page::index))
        .route("/page.js", get(page::script))
        .route(
            "/v1/openapi.json",
            get(move || async move {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    doc.to_string(),
                )
            }),
        )
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here")
        })
        .with_state(service)
}

/// The API's routes and their document.
fn api() -> (Router<Arc<Service>>, utoipa::openapi::OpenApi) {
    let (router, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health))
        .routes(routes!(metrics))
        .routes(routes!(demo))
        .routes(routes!(events))
        .routes(routes!(list))
        .routes(routes!(status, acquire))
        .routes(routes!(extend, release))
        .split_for_parts();
    CommonAnswers.modify(&mut doc);
    (router, doc)
}

/// The gate in front of every route, run by each connection before the router: requests
/// from other sites (see `sites`), the bearer token (or `access_token` in the query, for the
/// page's `EventSource`, which cannot set headers), refusal while stopping. `Some` is the
/// answer of a refused request. (A plain function rather than an axum middleware, which would
/// clone and box the router's service for every request.)
pub fn refused<B>(
    service: &Service,
    request: &Request<B>,
    arrived: SocketAddr,
    known: &super::sites::KnownHost,
) -> Option<Response> {
    if let Err(refused) = service.sites.check(request, arrived, known) {
        Some(refused.into_response())
    } else if !authorized(service, request.headers(), request.uri().query()) {
        let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
            .into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        Some(r)
    } else if service.is_stopping() {
        Some(ApiError::shutting_down().into_response())
    } else {
        None
    }
}

fn authorized(service: &Service, headers: &HeaderMap, query: Option<&str>) -> bool {
    let Some(expected) = service.token.as_deref() else {
        return true;
    };
    let from_header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let from_query = query.and_then(|q| {
        url_query_pairs(q)
            .into_iter()
            .find(|(k, _)| k == "access_token")
            .map(|(_, v)| v)
    });
    let given = from_header.map(str::to_owned).or(from_query);
    given.is_some_and(|g| constant_time_eq(g.as_bytes(), expected.as_bytes()))
}

/// `a=b&c=d` decoded, through axum's own query parser.
fn url_query_pairs(q: &str) -> Vec<(String, String)> {
    let Ok(uri) = format!("/?{q}").parse::<axum::http::Uri>() else {
        return Vec::new();
    };
    Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|Query(pairs)| pairs)
        .unwrap_or_default()
}

/// Compares without stopping at the first difference, so timing tells nothing of the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A request's body, as axum's `Bytes` extractor takes it under a `DefaultBodyLimit` of
/// [`MAX_BODY`] (the same rejection: 413 beyond it), but without collecting a body the request
/// declared empty: most requests have none, and collecting one costs more than the rest of
/// their extraction. The limit is applied here rather than by the layer, which would wrap
/// every route in one more boxed service, cloned and called for every request.
struct RequestBody(Bytes);

impl<S: Send + Sync> FromRequest<S> for RequestBody {
    type Rejection = <Bytes as FromRequest<S>>::Rejection;

    async fn from_request(
        request: Request<axum::body::Body>,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        if request.body().size_hint().exact() == Some(0) {
            return Ok(RequestBody(Bytes::new()));
        }
        // `Bytes` finds the `LengthLimitError` of this `Limited` inside its own (larger) one.
        let limited =
            request.map(|b| axum::body::Body::new(http_body_util::Limited::new(b, MAX_BODY)));
        Bytes::from_request(limited, state).await.map(RequestBody)
    }
}

/// The body as `T`; an empty body is `T::default()`.
fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("bad JSON body: {e}")))
}

/// What `PUT` answers.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Extended {
    /// The lease left, from now.
    pub remaining_ms: u64,
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(t)| t)
        .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())))
}

#[utoipa::path(
    post,
    path = "/v1/locks/{key}",
    summary = "Acquire the key's mutex, a shared (read) hold, or one permit of its semaphore: one attempt, or wait up to wait_ms",
    params(("key" = String, Path, description = "The lock's key, percent-encoded (1 to 1024 bytes of UTF-8)")),
    request_body(content = Option<AcquireRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Acquired", body = Granted),
        (status = 400, description = "Bad input: also shared and permits together, permits outside 1..=1000000, or permits other than the semaphore's holders use", body = ErrorBody),
        (status = 409, description = "Not acquired in time", body = ErrorBody),
        (status = 415, description = "A body without Content-Type: application/json", body = ErrorBody),
        (status = 501, description = "The backend has no locks of this kind (read-write locks or semaphores); nothing was taken", body = ErrorBody),
    )
)]
async fn acquire(
    State(service): State<Arc<Service>>,
    key: Result<Path<String>, PathRejection>,
    RequestBody(bytes): RequestBody,
) -> Result<Response, ApiError> {
    acquire_with(&service, path(key)?, &bytes).await
}

/// `POST /v1/locks/{key}` once its key is decoded and its body read.
async fn acquire_with(service: &Service, key: String, bytes: &Bytes) -> Result<Response, ApiError> {
    let req = body(bytes)?;
    let peer = super::holds::Peer::current();
    let granted = service.holds.acquire(key, req, peer).await?;
    Ok(granted_json(&granted).into_response())
}

/// A call of one of the two requests of every hold, `POST /v1/locks/{key}` and `DELETE
/// /v1/locks/{key}/{token}`, with its path decoded: see [`hot_route`].
pub enum Hot {
    Acquire(String),
    Release(String, String),
}

/// The route of a request that certainly goes to `acquire` or `release`, for the connection
/// to call them without the router: the router inserts the path's parameters into the
/// request's extensions, boxes and clones the route's service and wraps its future, which
/// together cost about as much again as the rest of the HTTP handling of the request. Only a
/// path the router would route there with every parameter decodable (the same decoding) is
/// taken; anything else (`None`) goes to the router, which answers it as before, errors
/// included. The answer is the handler's, with the `Content-Length` the router would add
/// (see [`hot`]).
pub fn hot_route(method: &Method, path: &str) -> Option<Hot> {
    let rest = path.strip_prefix("/v1/locks/")?;
    let (key, token) = match rest.split_once('/') {
        Some((key, token)) => (key, Some(token)),
        None => (rest, None),
    };
    let decode = |s: &str| -> Option<String> {
        if s.is_empty() || s.contains('/') {
            return None;
        }
        if !s.contains('%') {
            // Nothing to decode (what decoding would answer, without its two passes).
            return Some(s.to_owned());
        }
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(std::borrow::Cow::into_owned)
    };
    match (method, token) {
        (&Method::POST, None) => Some(Hot::Acquire(decode(key)?)),
        (&Method::DELETE, Some(token)) => Some(Hot::Release(decode(key)?, decode(token)?)),
        _ => None,
    }
}

/// Serves a request [`hot_route`] took, as the router would (the gate has passed it).
pub async fn hot<B>(service: Arc<Service>, call: Hot, request: Request<B>) -> Response
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let mut response = match call {
        Hot::Acquire(key) => {
            let request = request.map(axum::body::Body::new);
            match RequestBody::from_request(request, &()).await {
                Ok(RequestBody(bytes)) => acquire_with(&service, key, &bytes).await.into_response(),
                Err(rejection) => rejection.into_response(),
            }
        }
        Hot::Release(key, token) => {
            drop(request);
            release_with(&service, &key, &token).await.into_response()
        }
    };
    // What the router adds to every answer it routed (a body's known length); the methods
    // here are neither HEAD nor CONNECT, whose answers it also changes.
    let size = response.body().size_hint().exact();
    if let Some(size) = size.filter(|_| !response.headers().contains_key(header::CONTENT_LENGTH)) {
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, header::HeaderValue::from(size));
    }
    response
}

/// `granted` as its derived `Serialize` writes it, byte for byte (a test compares them), but
/// written straight into its buffer: the answer of every acquisition.
fn granted_json(granted: &Granted) -> impl IntoResponse {
    let mut out = Vec::with_capacity(granted.key.len() + 96);
    out.extend_from_slice(b"{\"key\":");
    // Any UTF-8: escaped as the derived serializer escapes it. Writing a `str` or an integer
    // to a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut out, &granted.key);
    out.extend_from_slice(b",\"token\":");
    let _ = serde_json::to_writer(&mut out, &granted.token);
    out.extend_from_slice(b",\"fence\":");
    let _ = serde_json::to_writer(&mut out, &granted.fence);
    out.extend_from_slice(b",\"lease_ms\":");
    let _ = serde_json::to_writer(&mut out, &granted.lease_ms);
    out.push(b'}');
    (
        [(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        )],
        out,
    )
}

#[utoipa::path(
    put,
    path = "/v1/locks/{key}/{token}",
    summary = "Extend: the lease becomes lease_ms from now",
    params(("key" = String, Path, description = "The lock's key, percent-encoded (1 to 1024 bytes of UTF-8)"), ("token" = String, Path, description = "The token the acquisition answered")),
    request_body(content = Option<ExtendRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Extended", body = Extended),
        (status = 410, description = "The hold is gone", body = ErrorBody),
        (status = 415, description = "A body without Content-Type: application/json", body = ErrorBody),
    )
)]
async fn extend(
    State(service): State<Arc<Service>>,
    p: Result<Path<(String, String)>, PathRejection>,
    RequestBody(bytes): RequestBody,
) -> Result<Response, ApiError> {
    let (key, token) = path(p)?;
    let req = body(&bytes)?;
    let remaining = service.holds.extend(&key, &token, req).await?;
    let remaining_ms = super::events::millis(remaining);
    Ok(Json(Extended { remaining_ms }).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/locks/{key}/{token}",
    summary = "Release",
    params(("key" = String, Path, description = "The lock's key, percent-encoded (1 to 1024 bytes of UTF-8)"), ("token" = String, Path, description = "The token the acquisition answered")),
    responses(
        (status = 204, description = "Released"),
        (status = 410, description = "The hold was already gone", body = ErrorBody),
    )
)]
async fn release(
    State(service): State<Arc<Service>>,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let (key, token) = path(p)?;
    release_with(&service, &key, &token).await
}

/// `DELETE /v1/locks/{key}/{token}` once its path is decoded.
async fn release_with(service: &Service, key: &str, token: &str) -> Result<StatusCode, ApiError> {
    service.holds.release(key, token).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get,
    path = "/v1/locks/{key}",
    summary = "The lock's state on the backend (the object of `distlock status --json`)",
    params(("key" = String, Path, description = "The lock's key, percent-encoded (1 to 1024 bytes of UTF-8)")),
    responses((status = 200, description = "State", body = crate::status::StatusJson)),
)]
/// The object of `distlock status --json`, from the backend itself.
async fn status(
    State(service): State<Arc<Service>>,
    key: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = path(key)?;
    let registry = service.holds.registry();
    let info = registry.obtain(&key)?.inspect().await?;
    let object = crate::status::to_json(
        &key,
        registry.options().prefix(),
        registry.backend().kind(),
        info.as_ref(),
    );
    Ok(([(header::CONTENT_TYPE, "application/json")], object).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/locks",
    summary = "Every lock under the prefix, as `distlock list --json` (complete: true), with this service's holds and waiters; where the backend cannot list, this service's holds only (complete: false)",
    responses((status = 200, description = "Locks", body = super::listing::ListAnswer)),
)]
/// Every lock under the prefix (from the backend where it can list), with this service's
/// holds and waiters.
async fn list(State(service): State<Arc<Service>>) -> Result<Response, ApiError> {
    let answer = super::listing::list(service.holds.registry(), &service.board).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], answer).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/events",
    summary = "Server-sent events: acquired (with lock_kind and, for a permit, permits), extended, released, lost, waiting, stopped_waiting, demo_started, demo_ended (with demonstration)",
    responses((status = 200, description = "An event stream", body = String, content_type = "text/event-stream")),
)]
async fn events(State(service): State<Arc<Service>>) -> Response {
    service.board.stream().into_response()
}

#[utoipa::path(
    post,
    path = "/demo",
    summary = "Starts the demonstration: workers hold the key in turn (one demonstration at a time)",
    request_body(content = Option<DemoRequest>, content_type = "application/json"),
    responses(
        (status = 202, description = "Started", body = Started),
        (status = 409, description = "A demonstration is running", body = ErrorBody),
        (status = 415, description = "A body without Content-Type: application/json", body = ErrorBody),
    )
)]
/// `POST /demo` with `{"key", "workers", "hold_ms"}` (all optional): 202 once it started.
async fn demo(
    State(service): State<Arc<Service>>,
    RequestBody(bytes): RequestBody,
) -> Result<Response, ApiError> {
    let req = body(&bytes)?;
    let started = service.demos.start(&service, req)?;
    Ok((StatusCode::ACCEPTED, Json(started)).into_response())
}

#[utoipa::path(
    get,
    path = "/healthz",
    summary = "Liveness",
    responses((status = 200, description = "ok", body = String, content_type = "text/plain")),
)]
async fn health() -> &'static str {
    "ok\n"
}

#[utoipa::path(
    get,
    path = "/metrics",
    summary = "Prometheus text",
    responses((status = 200, description = "Metrics", body = String, content_type = "text/plain")),
)]
async fn metrics(State(service): State<Arc<Service>>) -> Response {
    super::metrics::gauges(service.holds.len(), service.board.snapshot().1.len());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        service.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3creT"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn query_pairs_are_decoded() {
        assert_eq!(
            url_query_pairs("a=1&access_token=x%2By&b"),
            [("a", "1"), ("access_token", "x+y"), ("b", "")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert!(url_query_pairs("%%%").len() <= 1);
    }

    #[test]
    fn a_grant_is_written_as_its_serializer_writes_it() {
        for (key, fence) in [
            ("k", 0),
            ("a \"quoted\" \\ key\n\u{1}é/✓", u64::MAX),
            ("x", 1024),
        ] {
            let granted = Granted {
                key: key.to_owned(),
                token: distlock::Token::random().to_string(),
                fence,
                lease_ms: 30_000,
            };
            let response = granted_json(&granted).into_response();
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
            let body = futures_util::FutureExt::now_or_never(axum::body::to_bytes(
                response.into_body(),
                usize::MAX,
            ))
            .unwrap()
            .unwrap();
            assert_eq!(body, serde_json::to_vec(&granted).unwrap(), "{key:?}");
        }
    }

    /// What `RequestBody` answers for a body of `chunks` (chunked: no length declared).
    fn extracted(chunks: Vec<Vec<u8>>, declared: bool) -> Result<Bytes, Response> {
        let body = if declared {
            axum::body::Body::from(chunks.concat())
        } else {
            let frames = chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
            axum::body::Body::from_stream(futures_util::stream::iter(frames))
        };
        let request = Request::post("/").body(body).unwrap();
        futures_util::FutureExt::now_or_never(RequestBody::from_request(request, &()))
            .expect("ready")
            .map(|RequestBody(b)| b)
            .map_err(IntoResponse::into_response)
    }

    #[test]
    fn bodies_beyond_the_limit_are_refused_with_413() {
        for declared in [true, false] {
            let whole = extracted(vec![vec![b' '; MAX_BODY / 2]; 2], declared).unwrap();
            assert_eq!(whole.len(), MAX_BODY);
            let over = extracted(
                vec![vec![b' '; MAX_BODY / 2], vec![b' '; MAX_BODY / 2 + 1]],
                declared,
            )
            .unwrap_err();
            assert_eq!(
                over.status(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "declared: {declared}"
            );
            assert!(extracted(Vec::new(), declared).unwrap().is_empty());
        }
    }

    #[test]
    fn only_paths_the_router_sends_to_acquire_or_release_are_hot() {
        let acquire = |p: &str| match hot_route(&Method::POST, p) {
            Some(Hot::Acquire(key)) => Some(key),
            _ => None,
        };
        let release = |p: &str| match hot_route(&Method::DELETE, p) {
            Some(Hot::Release(key, token)) => Some((key, token)),
            _ => None,
        };
        assert_eq!(acquire("/v1/locks/k").as_deref(), Some("k"));
        assert_eq!(
            acquire("/v1/locks/a%2Fb%20%C3%A9").as_deref(),
            Some("a/b é")
        );
        assert_eq!(
            release("/v1/locks/a%2Fb/t0"),
            Some(("a/b".to_owned(), "t0".to_owned()))
        );
        // Left to the router: other methods, other shapes, empty segments, bad UTF-8.
        for p in [
            "/v1/locks/",
            "/v1/locks/k/",
            "/v1/locks/k/t",
            "/v1/locks",
            "/v1/lock/k",
            "/v1/locks/%FF",
            "/v1/locks/%C3",
        ] {
            assert_eq!(acquire(p), None, "{p}");
        }
        for p in [
            "/v1/locks/k",
            "/v1/locks//t",
            "/v1/locks/k/",
            "/v1/locks/k/t/",
            "/v1/locks/k/t/u",
            "/v1/locks/k/%FF",
        ] {
            assert_eq!(release(p), None, "{p}");
        }
        for m in [Method::GET, Method::PUT, Method::HEAD, Method::PATCH] {
            assert!(
                hot_route(&m, "/v1/locks/k").is_none() && hot_route(&m, "/v1/locks/k/t").is_none()
            );
        }
    }

    /// Status, headers and body of an answer.
    async fn seen(response: Response) -> (StatusCode, Vec<(String, String)>, String) {
        let status = response.status();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    /// The token a grant's body names, and the body with it and the fence blanked (tokens are
    /// random, fences grow).
    fn token_of(body: &str) -> (String, String) {
        let Some(at) = body.find("\"token\":\"") else {
            return (String::new(), body.to_owned());
        };
        let start = at + "\"token\":\"".len();
        let mut blanked = body.to_owned();
        let token = blanked[start..start + 32].to_owned();
        blanked.replace_range(start..start + 32, "T");
        let fence = blanked.find("\"fence\":").unwrap() + "\"fence\":".len();
        let digits = blanked[fence..].find(',').unwrap();
        blanked.replace_range(fence..fence + digits, "F");
        (token, blanked)
    }

    #[tokio::test]
    async fn hot_answers_are_the_routers() {
        use super::super::{events::Board, holds::Holds, sites::Sites};
        let options = distlock::RegistryOptions::default();
        let registry = distlock::LockRegistry::from_backend(
            distlock::connect("memory://").await.unwrap(),
            options.clone().with_renew(false).with_max_local_handoffs(0),
        )
        .unwrap();
        let (_stop, stopping) = tokio::sync::watch::channel(false);
        let board = Board::default();
        let service = Arc::new(Service {
            holds: Holds::new(registry, board.clone(), stopping.clone()),
            board,
            token: None,
            sites: Sites::new(&[], false).unwrap(),
            demos: super::super::demo::Demos::default(),
            metrics: metrics_exporter_prometheus::PrometheusBuilder::new()
                .build_recorder()
                .handle(),
            options,
            stopping,
        });
        let routed = hyper_util::service::TowerToHyperService::new(router(service.clone()));
        let request = |method: &str, path: &str, body: &str| {
            Request::builder()
                .method(method)
                .uri(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(axum::body::Body::from(body.to_owned()))
                .unwrap()
        };
        let by_router = |method: &str, path: &str, body: &str| {
            let answer = hyper::service::Service::call(&routed, request(method, path, body));
            async move { seen(answer.await.unwrap()).await }
        };
        let by_hot = |method: &str, path: &str, body: &str| {
            let call = hot_route(&method.parse().unwrap(), path).expect("hot");
            let answer = hot(service.clone(), call, request(method, path, body));
            async move { seen(answer.await).await }
        };
        let big = " ".repeat(MAX_BODY + 1);
        let bodies = [
            "",
            "{\"lease_ms\":5000}",
            "{\"lease\":1}",
            "{\"lease_ms\":1}",
            &big,
        ];
        // Each acquisition by either, released before the other's (same state for both).
        for body in bodies {
            let path = "/v1/locks/k%2F%C3%A9";
            let (status, headers, text) = by_router("POST", path, body).await;
            service.holds.release_all().await;
            let (hot_status, hot_headers, hot_text) = by_hot("POST", path, body).await;
            service.holds.release_all().await;
            assert_eq!((hot_status, hot_headers), (status, headers), "{body:.20}");
            assert_eq!(token_of(&hot_text).1, token_of(&text).1, "{body:.20}");
        }
        let held = service
            .holds
            .registry()
            .obtain("held")
            .unwrap()
            .try_lock()
            .await
            .unwrap();
        let conflict = by_router("POST", "/v1/locks/held", "").await;
        assert_eq!(conflict.0, StatusCode::CONFLICT);
        assert_eq!(by_hot("POST", "/v1/locks/held", "").await, conflict);
        held.release().await.unwrap();
        // Releases: of a hold (204), of a token that names none and of one that is no token
        // (410).
        let (_, _, grant) = by_hot("POST", "/v1/locks/r", "").await;
        let path = format!("/v1/locks/r/{}", token_of(&grant).0);
        let released = by_router("DELETE", &path, "").await;
        assert_eq!(released.0, StatusCode::NO_CONTENT);
        let (_, _, grant) = by_router("POST", "/v1/locks/r", "").await;
        let path = format!("/v1/locks/r/{}", token_of(&grant).0);
        assert_eq!(by_hot("DELETE", &path, "").await, released);
        for path in [
            "/v1/locks/r/0123456789abcdef0123456789abcdef",
            "/v1/locks/r/nothex",
        ] {
            let gone = by_router("DELETE", path, "").await;
            assert_eq!(gone.0, StatusCode::GONE);
            assert_eq!(by_hot("DELETE", path, "").await, gone, "{path}");
        }
    }

    #[test]
    fn bodies_are_optional_and_strict() {
        let empty: super::super::holds::AcquireRequest = body(&Bytes::from_static(b" \n")).unwrap();
        assert!(empty.lease_ms.is_none() && empty.wait_ms.is_none());
        let typo =
            body::<super::super::holds::AcquireRequest>(&Bytes::from_static(b"{\"lease\":1}"));
        assert_eq!(typo.unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn the_openapi_document_describes_every_api_route_and_its_bodies() {
        let doc: serde_json::Value =
            serde_json::from_str(&openapi::to_json(&api().1)).expect("JSON");
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let mut described: Vec<String> = Vec::new();
        for (path, operations) in doc["paths"].as_object().unwrap() {
            for (method, op) in operations.as_object().unwrap() {
                described.push(format!("{method} {path}"));
                for status in ["400", "401", "403", "503"] {
                    assert!(
                        op["responses"][status].is_object(),
                        "{method} {path}: {status}"
                    );
                }
            }
        }
        described.sort();
        assert_eq!(
            described,
            [
                "delete /v1/locks/{key}/{token}",
                "get /healthz",
                "get /metrics",
                "get /v1/events",
                "get /v1/locks",
                "get /v1/locks/{key}",
                "post /demo",
                "post /v1/locks/{key}",
                "put /v1/locks/{key}/{token}",
            ]
        );
        let schemas = &doc["components"]["schemas"];
        let fields = |name: &str| -> Vec<String> {
            let mut v: Vec<String> = schemas[name]["properties"]
                .as_object()
                .unwrap_or_else(|| panic!("no schema {name}"))
                .keys()
                .cloned()
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            fields("AcquireRequest"),
            ["lease_ms", "owner", "permits", "shared", "wait_ms"]
        );
        assert_eq!(fields("Granted"), ["fence", "key", "lease_ms", "token"]);
        assert!(fields("ListAnswer").contains(&"locks".to_owned()));
        assert!(fields("StatusJson").contains(&"owners".to_owned()));
    }
}
