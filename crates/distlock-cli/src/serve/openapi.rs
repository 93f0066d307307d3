//! `GET /v1/openapi.json`: the OpenAPI 3 description of DESIGN §5, written by hand.

use serde_json::{json, Value};

fn error_answer(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    })
}

fn key_param() -> Value {
    json!({
        "name": "key", "in": "path", "required": true,
        "description": "The lock's key, percent-encoded (1 to 1024 bytes of UTF-8)",
        "schema": {"type": "string"}
    })
}

fn token_param() -> Value {
    json!({
        "name": "token", "in": "path", "required": true,
        "description": "The token the acquisition answered",
        "schema": {"type": "string"}
    })
}

fn json_body(schema: &str) -> Value {
    json!({
        "required": false,
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}
    })
}

/// The document.
pub fn document() -> Value {
    let common = json!({
        "400": error_answer("Bad input"),
        "401": error_answer("Missing or wrong bearer token"),
        "503": error_answer("The backend is unreachable, or the service is shutting down"),
    });
    let with = |extra: Value| {
        let mut all = common.clone();
        if let (Some(all), Some(extra)) = (all.as_object_mut(), extra.as_object()) {
            all.extend(extra.clone());
        }
        all
    };
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "distlock serve",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Distributed locks over HTTP. A hold is a lease its caller owns: \
                without PUT or DELETE it ends with its lease."
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/locks/{key}": {
                "parameters": [key_param()],
                "post": {
                    "summary": "Acquire: one attempt, or wait up to wait_ms",
                    "requestBody": json_body("AcquireRequest"),
                    "responses": with(json!({
                        "200": {"description": "Acquired", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Granted"}}}},
                        "409": error_answer("Not acquired in time"),
                    })),
                },
                "get": {
                    "summary": "The lock's state on the backend (the object of `distlock status --json`)",
                    "responses": with(json!({"200": {"description": "State", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Status"}}}}})),
                },
            },
            "/v1/locks/{key}/{token}": {
                "parameters": [key_param(), token_param()],
                "put": {
                    "summary": "Extend: the lease becomes lease_ms from now",
                    "requestBody": json_body("ExtendRequest"),
                    "responses": with(json!({
                        "200": {"description": "Extended", "content": {"application/json": {"schema": {"type": "object", "properties": {"remaining_ms": {"type": "integer"}}}}}},
                        "410": error_answer("The hold is gone"),
                    })),
                },
                "delete": {
                    "summary": "Release",
                    "responses": with(json!({
                        "204": {"description": "Released"},
                        "410": error_answer("The hold was already gone"),
                    })),
                },
            },
            "/v1/locks": {
                "get": {
                    "summary": "The holds and waiters this service knows (complete: false: locks taken elsewhere are not listed)",
                    "responses": with(json!({"200": {"description": "Locks", "content": {"application/json": {"schema": {"type": "object"}}}}})),
                },
            },
            "/v1/events": {
                "get": {
                    "summary": "Server-sent events: acquired, extended, released, lost, waiting, stopped_waiting",
                    "responses": with(json!({"200": {"description": "An event stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}}})),
                },
            },
            "/demo": {
                "get": {
                    "summary": "Starts the demonstration: workers hold the key in turn",
                    "parameters": [
                        {"name": "key", "in": "query", "schema": {"type": "string", "default": "demo"}},
                        {"name": "workers", "in": "query", "schema": {"type": "integer", "default": 10, "minimum": 1, "maximum": 100}},
                        {"name": "hold", "in": "query", "schema": {"type": "string", "default": "3s"}},
                    ],
                    "responses": with(json!({"200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}})),
                },
            },
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
            "/metrics": {"get": {"summary": "Prometheus text", "responses": {"200": {"description": "Metrics"}}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                "AcquireRequest": {"type": "object", "additionalProperties": false, "properties": {
                    "lease_ms": {"type": "integer", "minimum": 10, "default": 30000},
                    "wait_ms": {"type": "integer", "minimum": 0, "maximum": 3_600_000},
                    "shared": {"type": "boolean", "description": "not supported yet (400)"},
                    "permits": {"type": "integer", "description": "not supported yet (400)"},
                }},
                "ExtendRequest": {"type": "object", "additionalProperties": false, "properties": {
                    "lease_ms": {"type": "integer", "minimum": 10, "default": 30000},
                }},
                "Granted": {"type": "object", "properties": {
                    "key": {"type": "string"}, "token": {"type": "string"},
                    "fence": {"type": "integer"}, "lease_ms": {"type": "integer"},
                }},
                "Status": {"type": "object", "properties": {
                    "key": {"type": "string"}, "prefix": {"type": "string"}, "held": {"type": "boolean"},
                    "fence": {"type": "integer", "nullable": true}, "backend_fence": {"type": "integer", "nullable": true},
                    "remaining_ms": {"type": "integer", "nullable": true}, "backend": {"type": "string"},
                }},
            }
        }
    })
}
