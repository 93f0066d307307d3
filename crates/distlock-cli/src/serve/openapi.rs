//! `GET /v1/openapi.json`: the OpenAPI document of the API (docs/SERVE.md), derived. Each
//! handler carries its operation (`#[utoipa::path]` in `routes`), each body type its schema
//! (`ToSchema`), and the router registers the handlers through the same list that collects
//! their operations (`utoipa_axum::routes!`), so the document cannot describe a route that is
//! not served, nor miss one that is, nor disagree with a body's fields.

use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, ToSchema};

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for a person to read.
    pub error: String,
}

/// The document's parts that belong to no route: its title, the bearer scheme, and the
/// answers any route may give.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "distlock serve",
        description = "Distributed locks over HTTP. A hold is a lease its caller owns: without PUT or DELETE it ends with its lease."
    ),
    security(("bearer" = [])),
    components(schemas(ErrorBody))
)]
pub struct ApiDoc;

/// Adds the bearer scheme, and to every operation the answers the gate in front of all
/// routes may give (bad input, authorization, other sites, an unreachable backend). Applied
/// to the whole document, once the routes have added their operations.
pub struct CommonAnswers;

/// An error answer: `description`, with an [`ErrorBody`].
pub fn error_answer(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            utoipa::openapi::ContentBuilder::new()
                .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
        .into()
}

impl Modify for CommonAnswers {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        let common = [
            ("400", "Bad input"),
            ("401", "Missing or wrong bearer token"),
            ("403", "Host is not an address the service listens on (nor a name given with --allow-host), or a state-changing request from another site (Origin, Sec-Fetch-Site)"),
            ("503", "The backend is unreachable, or the service is shutting down"),
        ];
        for item in doc.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
            ];
            for op in operations.into_iter().flatten() {
                for (status, description) in common {
                    op.responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| error_answer(description));
                }
            }
        }
    }
}

/// The document of the routes `router` registered, as JSON text.
pub fn to_json(doc: &utoipa::openapi::OpenApi) -> String {
    let mut doc = doc.clone();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.to_json().expect("an OpenAPI document serializes")
}
