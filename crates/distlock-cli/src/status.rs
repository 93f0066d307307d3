//! `distlock status`: is a lock held, by what kind of holds, by which fence, for how much
//! longer.

use distlock::LockInfo;
use serde::Serialize;

use crate::config::{Failure, Global, DEFAULT_KIND};
use crate::run::describe_holder;
use crate::util::{holder_fence, out};

/// Exit status when the lock is free.
pub const EXIT_FREE: i32 = 3;

/// Prints the lock's state; exit 0 when held, 3 when free.
pub async fn status(global: &Global, key: &str, json: bool) -> Result<i32, Failure> {
    let (info, backend) = match global.registry_if_any().await? {
        Some(registry) => {
            let info = registry.obtain(key)?.inspect().await?;
            (info, registry.backend().kind())
        }
        None => (None, DEFAULT_KIND),
    };
    if json {
        out(&to_json(
            key,
            global.prefix.as_str(),
            backend,
            info.as_ref(),
        ));
    } else {
        out(&to_text(key, backend, info.as_ref()));
    }
    Ok(if info.is_some() { 0 } else { EXIT_FREE })
}

fn to_text(key: &str, backend: &str, info: Option<&LockInfo>) -> String {
    match info {
        Some(info) => format!("lock {key:?}: {} ({backend})", describe_holder(info)),
        None => format!("lock {key:?}: free ({backend})"),
    }
}

/// The JSON object of `status --json`; the field order is the output's.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct StatusJson<'a> {
    key: &'a str,
    prefix: &'a str,
    held: bool,
    fence: Option<u64>,
    backend_fence: Option<u64>,
    remaining_ms: Option<u128>,
    backend: &'a str,
    kind: Option<&'static str>,
    permits: Option<u32>,
    holders: Option<u32>,
    waiters: Option<u32>,
    owners: Option<Vec<String>>,
}

/// One JSON object. `fence` is what a `distlock run` holder sees in `DISTLOCK_FENCE`;
/// `backend_fence` is the backend's own counter. `kind` (`mutex`, `read`, `write`,
/// `semaphore`), `permits` (a semaphore's, where recorded), `holders` and `waiters` are null
/// where the backend cannot tell. `owners` lists the holders' descriptions (`[]` when free,
/// null where the backend records none).
pub(crate) fn to_json(key: &str, prefix: &str, backend: &str, info: Option<&LockInfo>) -> String {
    serde_json::to_string(&status_json(key, prefix, backend, info)).expect("plain fields serialize")
}

/// The object of [`to_json`], to serialize or to embed in another (`serve`'s list).
pub(crate) fn status_json<'a>(
    key: &'a str,
    prefix: &'a str,
    backend: &'a str,
    info: Option<&LockInfo>,
) -> StatusJson<'a> {
    let fence = info.and_then(|i| i.fence);
    StatusJson {
        key,
        prefix,
        held: info.is_some(),
        fence: fence.map(holder_fence),
        backend_fence: fence,
        remaining_ms: info.and_then(|i| i.remaining).map(|r| r.as_millis()),
        backend,
        kind: info.and_then(|i| i.kind).map(|k| k.name()),
        permits: info.and_then(|i| match i.kind {
            Some(distlock::LockKind::Semaphore { permits }) if permits > 0 => Some(permits),
            _ => None,
        }),
        holders: info.and_then(|i| i.holders),
        waiters: info.and_then(|i| i.waiters),
        owners: match info {
            None => Some(Vec::new()),
            Some(i) if i.owners.is_empty() => None,
            Some(i) => Some(i.owners.clone()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn json_of_a_held_and_a_free_lock() {
        let info = LockInfo::new(Some(4), Some(Duration::from_millis(29_000)));
        assert_eq!(
            to_json("a\"b", "lock", "redis", Some(&info)),
            r#"{"key":"a\"b","prefix":"lock","held":true,"fence":4096,"backend_fence":4,"remaining_ms":29000,"backend":"redis","kind":null,"permits":null,"holders":null,"waiters":null,"owners":null}"#
        );
        assert_eq!(
            to_json("k", "lock", "sqlite", None),
            r#"{"key":"k","prefix":"lock","held":false,"fence":null,"backend_fence":null,"remaining_ms":null,"backend":"sqlite","kind":null,"permits":null,"holders":null,"waiters":null,"owners":[]}"#
        );
    }

    #[test]
    fn json_of_shared_holds_names_kind_holders_and_waiters() {
        let info = LockInfo::new(Some(4), Some(Duration::from_millis(10)))
            .with_kind(distlock::LockKind::Semaphore { permits: 3 })
            .with_holders(2)
            .with_waiters(5);
        let json: serde_json::Value =
            serde_json::from_str(&to_json("k", "lock", "memory", Some(&info))).unwrap();
        assert_eq!(json["kind"], "semaphore");
        assert_eq!(json["permits"], 3);
        assert_eq!(json["holders"], 2);
        assert_eq!(json["waiters"], 5);
    }

    #[test]
    fn json_keys_with_any_characters_parse_back() {
        let key = "x\ny\tz\r\u{1}\u{1f}\u{7f}\"\\ünï/cødé 🔒";
        let json = to_json(key, "p", "memory", None);
        assert!(!json.contains('\n'), "one line: {json}");
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back["key"], key);
        assert_eq!(back["fence"], serde_json::Value::Null);
    }

    #[test]
    fn owners_are_named_in_text_and_json() {
        let info = LockInfo::new(Some(1), Some(Duration::from_secs(12)))
            .with_owners(["web-2:9".to_string(), "web-1:7".to_string()]);
        assert_eq!(
            to_text("k", "redis", Some(&info)),
            r#"lock "k": held by web-1:7, web-2:9, fence 1024, lease left 12s (redis)"#
        );
        let json: serde_json::Value =
            serde_json::from_str(&to_json("k", "lock", "redis", Some(&info))).unwrap();
        assert_eq!(json["owners"], serde_json::json!(["web-1:7", "web-2:9"]));
        let free: serde_json::Value =
            serde_json::from_str(&to_json("k", "lock", "redis", None)).unwrap();
        assert_eq!(free["owners"], serde_json::json!([]));
        let many = LockInfo::new(None, None).with_owners((0..5).map(|i| format!("h{i}")));
        assert!(
            to_text("k", "redis", Some(&many)).contains("by h0, h1, h2 and 2 more"),
            "{}",
            to_text("k", "redis", Some(&many))
        );
    }

    #[test]
    fn text_of_a_held_and_a_free_lock() {
        let info = LockInfo::new(Some(1), Some(Duration::from_secs(12)));
        assert_eq!(
            to_text("k", "sqlite", Some(&info)),
            r#"lock "k": held, fence 1024, lease left 12s (sqlite)"#
        );
        assert_eq!(to_text("k", "sqlite", None), r#"lock "k": free (sqlite)"#);
    }
}
