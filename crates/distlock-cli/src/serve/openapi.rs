//! `GET /v1/openapi.json`: the OpenAPI 3 description of the API (docs/SERVE.md). Its paths and
//! methods come from the router's own list of routes ([`Route::ALL`]), each described by an
//! exhaustive match; the schemas of the bodies are written here, and tests check them against
//! the fields of the types the handlers read and write.

use serde_json::{json, Value};

use super::routes::Route;

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

fn kind_schema() -> Value {
    json!({"type": "string", "enum": ["mutex", "read", "write", "semaphore"],
           "description": "mutex: exclusive; read: shared; write: the exclusive side of a read-write lock; semaphore: permits"})
}

/// The object of `distlock status --json`.
fn status_properties() -> Value {
    let nullable_int = json!({"type": "integer", "nullable": true});
    json!({
        "key": {"type": "string"}, "prefix": {"type": "string"}, "held": {"type": "boolean"},
        "fence": nullable_int, "backend_fence": nullable_int, "remaining_ms": nullable_int,
        "backend": {"type": "string"},
        "kind": {"allOf": [kind_schema()], "nullable": true},
        "permits": nullable_int, "holders": nullable_int, "waiters": nullable_int,
        "owners": {"type": "array", "items": {"type": "string"}, "nullable": true,
                   "description": "who holds the key: one description per holder ([] when free, null where the backend records none)"},
    })
}

/// A line of `distlock list --json`, and what this service has of it.
fn listed_properties() -> Value {
    let mut properties = status_properties();
    if let Some(map) = properties.as_object_mut() {
        map.insert(
            "holds_here".into(),
            json!({"type": "integer", "description": "holds of this service on the key"}),
        );
        map.insert("waiting_here".into(), json!({"type": "integer", "description": "callers of this service waiting for the key"}));
        map.insert("other_holders".into(), json!({"type": "integer", "nullable": true, "description": "holders that are not this service's; null where the backend does not count holders"}));
    }
    properties
}

/// The operation of `route`, or `None` for what is not part of the API (the page, this
/// document). The match is exhaustive: a new route needs its description here.
fn operation(route: Route, with: &dyn Fn(Value) -> Value) -> Option<Value> {
    Some(match route {
        Route::Page | Route::Script | Route::OpenApi => return None,
        Route::Acquire => json!({
        "parameters": [key_param()],
                "summary": "Acquire the key's mutex, a shared (read) hold, or one permit of its semaphore: one attempt, or wait up to wait_ms",
                "requestBody": json_body("AcquireRequest"),
                "responses": with(json!({
                    "200": {"description": "Acquired", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Granted"}}}},
                    "400": error_answer("Bad input: also shared and permits together, permits outside 1..=1000000, or permits other than the semaphore's holders use"),
                    "409": error_answer("Not acquired in time"),
                    "415": error_answer("A body without Content-Type: application/json"),
                    "501": error_answer("The backend has no locks of this kind (read-write locks or semaphores); nothing was taken"),
                })),
            }),
        Route::Status => json!({
        "parameters": [key_param()],
                "summary": "The lock's state on the backend (the object of `distlock status --json`)",
                "responses": with(json!({"200": {"description": "State", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Status"}}}}})),
            }),
        Route::Extend => json!({
        "parameters": [key_param(), token_param()],
                "summary": "Extend: the lease becomes lease_ms from now",
                "requestBody": json_body("ExtendRequest"),
                "responses": with(json!({
                    "200": {"description": "Extended", "content": {"application/json": {"schema": {"type": "object", "properties": {"remaining_ms": {"type": "integer"}}}}}},
                    "410": error_answer("The hold is gone"),
                    "415": error_answer("A body without Content-Type: application/json"),
                })),
            }),
        Route::Release => json!({
        "parameters": [key_param(), token_param()],
                "summary": "Release",
                "responses": with(json!({
                    "204": {"description": "Released"},
                    "410": error_answer("The hold was already gone"),
                })),
            }),
        Route::List => json!({
            "summary": "Every lock under the prefix, as `distlock list --json` (complete: true), with this service's holds and waiters; where the backend cannot list, this service's holds only (complete: false)",
            "responses": with(json!({"200": {"description": "Locks", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/List"}}}}})),
        }),
        Route::Events => json!({
            "summary": "Server-sent events: acquired (with lock_kind and, for a permit, permits), extended, released, lost, waiting, stopped_waiting, demo_started, demo_ended (with demonstration)",
            "responses": with(json!({"200": {"description": "An event stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}}})),
        }),
        Route::Demo => json!({
            "summary": "Starts the demonstration: workers hold the key in turn (one demonstration at a time)",
            "requestBody": json_body("DemoRequest"),
            "responses": with(json!({
                "202": {"description": "Started", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DemoStarted"}}}},
                "409": error_answer("A demonstration is running"),
                "415": error_answer("A body without Content-Type: application/json"),
            })),
        }),
        Route::Health => {
            json!({"summary": "Liveness", "responses": {"200": {"description": "ok"}}})
        }
        Route::Metrics => {
            json!({"summary": "Prometheus text", "responses": {"200": {"description": "Metrics"}}})
        }
    })
}

/// `paths`: every route of [`Route::ALL`] that is part of the API, under its path and method.
fn paths(with: &dyn Fn(Value) -> Value) -> Value {
    let mut paths = serde_json::Map::new();
    for route in Route::ALL {
        if let Some(op) = operation(route, with) {
            let entry = paths.entry(route.path()).or_insert_with(|| json!({}));
            entry[route.method().as_str().to_ascii_lowercase()] = op;
        }
    }
    Value::Object(paths)
}

/// The document.
pub fn document() -> Value {
    let common = json!({
        "400": error_answer("Bad input"),
        "401": error_answer("Missing or wrong bearer token"),
        "403": error_answer("Host is not an address the service listens on (nor a name given with --allow-host), or a state-changing request from another site (Origin, Sec-Fetch-Site)"),
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
        "paths": paths(&with),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                "AcquireRequest": {"type": "object", "additionalProperties": false, "properties": {
                    "lease_ms": {"type": "integer", "minimum": 10, "default": 30000},
                    "wait_ms": {"type": "integer", "minimum": 0, "maximum": 3_600_000},
                    "shared": {"type": "boolean", "default": false, "description": "a shared hold: the read side of the key's read-write lock (with other shared holds, never with an exclusive one)"},
                    "permits": {"type": "integer", "minimum": 1, "maximum": 1_000_000, "description": "one permit of the key's semaphore of this many permits; not with shared"},
                    "owner": {"type": "string", "maxLength": 128, "description": "who holds it, as listings show it (printable, no URL); default: http <the caller's address>"},
                }},
                "DemoRequest": {"type": "object", "additionalProperties": false, "properties": {
                    "key": {"type": "string", "default": "demo"},
                    "workers": {"type": "integer", "minimum": 1, "maximum": 10, "default": 10},
                    "hold_ms": {"type": "integer", "minimum": 10, "maximum": 5000, "default": 3000},
                }},
                "DemoStarted": {"type": "object", "properties": {
                    "demo": {"type": "integer", "description": "its id: the demo field of its events"},
                    "key": {"type": "string"}, "workers": {"type": "integer"}, "hold_ms": {"type": "integer"},
                }},
                "ExtendRequest": {"type": "object", "additionalProperties": false, "properties": {
                    "lease_ms": {"type": "integer", "minimum": 10, "default": 30000},
                }},
                "Granted": {"type": "object", "properties": {
                    "key": {"type": "string"}, "token": {"type": "string"},
                    "fence": {"type": "integer"}, "lease_ms": {"type": "integer"},
                }},
                "Status": {"type": "object", "properties": status_properties()},
                "ListedLock": {"type": "object", "properties": listed_properties()},
                "Hold": {"type": "object", "description": "A hold of this service (an HTTP caller's or the demonstration's)", "properties": {
                    "hold": {"type": "integer", "description": "its id on the page and in events (not its token)"},
                    "key": {"type": "string"}, "kind": kind_schema(),
                    "permits": {"type": "integer", "description": "semaphores only"},
                    "holder": {"type": "string"}, "fence": {"type": "integer"}, "lease_ms": {"type": "integer"},
                    "demo": {"type": "integer", "description": "the demonstration whose worker holds it"},
                    "expires_at_ms": {"type": "integer", "description": "when its lease ends, ms since the Unix epoch"},
                }},
                "Waiter": {"type": "object", "properties": {
                    "waiter": {"type": "integer"}, "key": {"type": "string"}, "holder": {"type": "string"},
                    "demo": {"type": "integer", "description": "the demonstration whose worker waits"},
                    "since_ms": {"type": "integer"},
                }},
                "List": {"type": "object", "required": ["complete", "locks", "holds", "waiters", "seq", "now_ms"], "properties": {
                    "complete": {"type": "boolean", "description": "true: locks is every lock under the prefix, from the backend; false: the backend cannot list, and locks has this service's holds only"},
                    "note": {"type": "string", "description": "with complete: false, why"},
                    "locks": {"type": "array", "items": {"$ref": "#/components/schemas/ListedLock"}},
                    "holds": {"type": "array", "items": {"$ref": "#/components/schemas/Hold"}},
                    "waiters": {"type": "array", "items": {"$ref": "#/components/schemas/Waiter"}},
                    "seq": {"type": "integer", "description": "the last event the holds and waiters include"},
                    "now_ms": {"type": "integer"},
                    "timeline": {"type": "array", "items": {"type": "object"}},
                }},
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use serde::de::{self, Deserialize, Deserializer, Visitor};

    use super::*;

    /// A deserializer that only learns which fields a struct reads.
    struct FieldsOf(Vec<&'static str>);

    impl<'de> Deserializer<'de> for &mut FieldsOf {
        type Error = de::value::Error;

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = fields.to_vec();
            Err(de::Error::custom("only the fields were wanted"))
        }

        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    fn fields_of<'de, T: Deserialize<'de>>() -> Vec<String> {
        let mut probe = FieldsOf(Vec::new());
        let _ = T::deserialize(&mut probe);
        let mut fields: Vec<String> = probe.0.iter().map(|f| (*f).to_owned()).collect();
        fields.sort();
        fields
    }

    fn properties_of(schema: &str) -> Vec<String> {
        let doc = document();
        let properties = doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("no schema {schema}"));
        let mut names: Vec<String> = properties.keys().cloned().collect();
        names.sort();
        names
    }

    fn keys_of(value: impl serde::Serialize) -> Vec<String> {
        let value = serde_json::to_value(value).unwrap();
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    #[test]
    fn the_body_schemas_have_the_fields_the_handlers_read_and_write() {
        use super::super::demo::{DemoRequest, Started};
        use super::super::holds::{AcquireRequest, ExtendRequest, Granted};
        assert_eq!(
            properties_of("AcquireRequest"),
            fields_of::<AcquireRequest>()
        );
        assert_eq!(properties_of("ExtendRequest"), fields_of::<ExtendRequest>());
        assert_eq!(properties_of("DemoRequest"), fields_of::<DemoRequest>());
        let granted = Granted {
            key: "k".into(),
            token: "t".into(),
            fence: 1,
            lease_ms: 1,
        };
        assert_eq!(properties_of("Granted"), keys_of(granted));
        let started = Started {
            demo: 1,
            key: "k".into(),
            workers: 1,
            hold_ms: 1,
        };
        assert_eq!(properties_of("DemoStarted"), keys_of(started));
    }
}
