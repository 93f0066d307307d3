//! The HTTP surface of docs/SERVE.md: one router, thin handlers that call the holds, the board and
//! the library; bad input becomes 400 with `{"error"}` before anything is taken.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use super::{page, ApiError, Service};
use crate::duration::parse_duration;

/// Largest request body accepted: the bodies are a few small numbers.
const MAX_BODY: usize = 16 * 1024;

/// The whole router over `service`.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route("/page.js", get(page::script))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/demo", get(demo))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/events", get(events))
        .route("/v1/locks", get(list))
        .route("/v1/locks/{key}", get(status).post(acquire))
        .route(
            "/v1/locks/{key}/{token}",
            axum::routing::put(extend).delete(release),
        )
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(service.clone(), gate))
        .with_state(service)
}

/// Bearer token (or `access_token` in the query, for the page's `EventSource`, which cannot
/// set headers), refusal while stopping, and the request counter.
async fn gate(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let response = if !authorized(&service, request.headers(), request.uri().query()) {
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
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let key = path(key)?;
    let req = body(&bytes)?;
    let granted = service.holds.acquire(&key, req).await?;
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

/// `GET /demo?key=K[&workers=N][&hold=DUR]`.
#[derive(Debug, Deserialize)]
struct DemoQuery {
    key: Option<String>,
    workers: Option<u32>,
    hold: Option<String>,
}

async fn demo(
    State(service): State<Arc<Service>>,
    query: Result<Query<DemoQuery>, QueryRejection>,
) -> Result<&'static str, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let key = q.key.unwrap_or_else(|| "demo".into());
    distlock::validate_key(&key)?;
    let workers = q.workers.unwrap_or(10);
    if !(1..=100).contains(&workers) {
        return Err(ApiError::bad_request("workers must be 1 to 100"));
    }
    let hold = match q.hold.as_deref() {
        None => Duration::from_secs(3),
        Some(h) => parse_duration(h).map_err(ApiError::bad_request)?,
    };
    if hold > Duration::from_secs(600) {
        return Err(ApiError::bad_request("hold must be at most 10m"));
    }
    super::demo::start(&service, key, workers, hold).await?;
    Ok("OK\n")
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
    fn the_openapi_document_names_every_route() {
        let doc = super::super::openapi::document();
        assert_eq!(doc["openapi"], "3.0.3");
        assert_eq!(doc["paths"].as_object().map(|p| p.len()), Some(7));
    }
}
