//! The HTTP surface (docs/SERVE.md): one router, thin handlers that call the holds, the board
//! and the library; bad input becomes 400 with `{"error"}` before anything is taken.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{page, ApiError, Service};

/// Largest request body accepted: the bodies are a few small numbers.
const MAX_BODY: usize = 16 * 1024;

/// The routes, one variant each. The router and the OpenAPI document are both made from
/// [`Route::ALL`], and the matches on a route are exhaustive, so a route cannot be served
/// without being described, nor described without being served (a variant left out of `ALL`
/// is never constructed, which the compiler reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Page,
    Script,
    Health,
    Metrics,
    Demo,
    OpenApi,
    Events,
    List,
    Status,
    Acquire,
    Extend,
    Release,
}

impl Route {
    pub const ALL: [Route; 12] = [
        Route::Page,
        Route::Script,
        Route::Health,
        Route::Metrics,
        Route::Demo,
        Route::OpenApi,
        Route::Events,
        Route::List,
        Route::Status,
        Route::Acquire,
        Route::Extend,
        Route::Release,
    ];

    /// The path, in the syntax of both axum and OpenAPI.
    pub fn path(self) -> &'static str {
        match self {
            Route::Page => "/",
            Route::Script => "/page.js",
            Route::Health => "/healthz",
            Route::Metrics => "/metrics",
            Route::Demo => "/demo",
            Route::OpenApi => "/v1/openapi.json",
            Route::Events => "/v1/events",
            Route::List => "/v1/locks",
            Route::Status | Route::Acquire => "/v1/locks/{key}",
            Route::Extend | Route::Release => "/v1/locks/{key}/{token}",
        }
    }

    pub fn method(self) -> Method {
        match self {
            Route::Demo | Route::Acquire => Method::POST,
            Route::Extend => Method::PUT,
            Route::Release => Method::DELETE,
            Route::Page
            | Route::Script
            | Route::Health
            | Route::Metrics
            | Route::OpenApi
            | Route::Events
            | Route::List
            | Route::Status => Method::GET,
        }
    }

    fn handler(self) -> MethodRouter<Arc<Service>> {
        let filter = MethodFilter::try_from(self.method()).unwrap_or(MethodFilter::GET);
        match self {
            Route::Page => on(filter, page::index),
            Route::Script => on(filter, page::script),
            Route::Health => on(filter, || async { "ok\n" }),
            Route::Metrics => on(filter, metrics),
            Route::Demo => on(filter, demo),
            Route::OpenApi => on(filter, openapi),
            Route::Events => on(filter, events),
            Route::List => on(filter, list),
            Route::Status => on(filter, status),
            Route::Acquire => on(filter, acquire),
            Route::Extend => on(filter, extend),
            Route::Release => on(filter, release),
        }
    }
}

/// The whole router over `service`.
pub fn router(service: Arc<Service>) -> Router {
    Route::ALL
        .into_iter()
        .fold(Router::new(), |router, route| {
            router.route(route.path(), route.handler())
        })
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here")
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(service.clone(), gate))
        .with_state(service)
}

/// Requests from other sites (see `sites`), the bearer token (or `access_token` in the query,
/// for the page's `EventSource`, which cannot set headers), refusal while stopping, and the
/// request counter.
async fn gate(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let response = if let Err(refused) = service.sites.check(&request) {
        refused.into_response()
    } else if !authorized(&service, request.headers(), request.uri().query()) {
        let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
            .into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        r
    } else if service.is_stopping() {
        ApiError::shutting_down().into_response()
    } else {
        next.run(request).await
    };
    super::metrics::request(response.status().as_u16());
    response
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

/// The body as `T`; an empty body is `T::default()`.
fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("bad JSON body: {e}")))
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(t)| t)
        .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())))
}

async fn acquire(
    State(service): State<Arc<Service>>,
    key: Result<Path<String>, PathRejection>,
    peer: Option<axum::Extension<super::holds::Peer>>,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let key = path(key)?;
    let req = body(&bytes)?;
    let peer = peer.map(|axum::Extension(p)| p);
    let granted = service.holds.acquire(&key, req, peer).await?;
    Ok(Json(granted).into_response())
}

async fn extend(
    State(service): State<Arc<Service>>,
    p: Result<Path<(String, String)>, PathRejection>,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let (key, token) = path(p)?;
    let req = body(&bytes)?;
    let remaining = service.holds.extend(&key, &token, req).await?;
    Ok(Json(json!({ "remaining_ms": super::events::millis(remaining) })).into_response())
}

async fn release(
    State(service): State<Arc<Service>>,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let (key, token) = path(p)?;
    service.holds.release(&key, &token).await?;
    Ok(StatusCode::NO_CONTENT)
}

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

/// Every lock under the prefix (from the backend where it can list), with this service's
/// holds and waiters.
async fn list(State(service): State<Arc<Service>>) -> Result<Response, ApiError> {
    let answer = super::listing::list(service.holds.registry(), &service.board).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], answer).into_response())
}

async fn events(State(service): State<Arc<Service>>) -> Response {
    service.board.stream().into_response()
}

/// `POST /demo` with `{"key", "workers", "hold_ms"}` (all optional): 202 once it started.
async fn demo(State(service): State<Arc<Service>>, bytes: Bytes) -> Result<Response, ApiError> {
    let req = body(&bytes)?;
    let started = service.demos.start(&service, req)?;
    Ok((StatusCode::ACCEPTED, Json(started)).into_response())
}

async fn openapi() -> Response {
    Json(super::openapi::document()).into_response()
}

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
    fn bodies_are_optional_and_strict() {
        let empty: super::super::holds::AcquireRequest = body(&Bytes::from_static(b" \n")).unwrap();
        assert!(empty.lease_ms.is_none() && empty.wait_ms.is_none());
        let typo =
            body::<super::super::holds::AcquireRequest>(&Bytes::from_static(b"{\"lease\":1}"));
        assert_eq!(typo.unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn the_openapi_document_describes_the_routes_served() {
        let doc = super::super::openapi::document();
        assert_eq!(doc["openapi"], "3.0.3");
        let mut described = 0;
        for (path, operations) in doc["paths"].as_object().unwrap() {
            for method in operations.as_object().unwrap().keys() {
                let served = Route::ALL
                    .iter()
                    .any(|r| r.path() == path && r.method().as_str().eq_ignore_ascii_case(method));
                assert!(served, "{method} {path} is described but not served");
                described += 1;
            }
        }
        // Everything but the page and the document itself.
        assert_eq!(described, Route::ALL.len() - 3);
    }
}
