//! `distlock status`: is a lock held, by which fence, for how much longer.

use distlock::LockInfo;
use serde::Serialize;

use crate::config::{Failure, Global};
use crate::run::describe_holder;
use crate::util::{holder_fence, out};

/// Exit status when the lock is free.
pub const EXIT_FREE: i32 = 3;

/// Prints the lock's state; exit 0 when held, 3 when free.
pub async fn status(global: &Global, key: &str, json: bool) -> Result<i32, Failure> {
    let registry = global.registry().await?;
    let lock = registry.obtain(key)?;
    let info = lock.inspect().await?;
    let backend = registry.backend().kind();
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
        Some(info) => format!(
            "lock {key:?}: {} ({backend})",
            describe_holder(info.fence, info.remaining)
        ),
        None => format!("lock {key:?}: free ({backend})"),
    }
}

/// The JSON object of `status --json`; the field order is the output's.
#[derive(Debug, Serialize)]
struct StatusJson<'a> {
    key: &'a str,
    prefix: &'a str,
    held: bool,
    fence: Option<u64>,
    backend_fence: Option<u64>,
    remaining_ms: Option<u128>,
    backend: &'a str,
}

/// One JSON object. `fence` is what a `distlock run` holder sees in `DISTLOCK_FENCE`;
/// `backend_fence` is the backend's own counter.
pub(crate) fn to_json(key: &str, prefix: &str, backend: &str, info: Option<&LockInfo>) -> String {
    let fence = info.and_then(|i| i.fence);
    let status = StatusJson {
        key,
        prefix,
        held: info.is_some(),
        fence: fence.map(holder_fence),
        backend_fence: fence,
        remaining_ms: info.and_then(|i| i.remaining).map(|r| r.as_millis()),
        backend,
    };
    serde_json::to_string(&status).expect("plain fields serialize")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn json_of_a_held_and_a_free_lock() {
        let info = LockInfo {
            fence: Some(4),
            remaining: Some(Duration::from_millis(29_000)),
        };
        assert_eq!(
            to_json("a\"b", "lock", "redis", Some(&info)),
            r#"{"key":"a\"b","prefix":"lock","held":true,"fence":4096,"backend_fence":4,"remaining_ms":29000,"backend":"redis"}"#
        );
        assert_eq!(
            to_json("k", "lock", "sqlite", None),
            r#"{"key":"k","prefix":"lock","held":false,"fence":null,"backend_fence":null,"remaining_ms":null,"backend":"sqlite"}"#
        );
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
    fn text_of_a_held_and_a_free_lock() {
        let info = LockInfo {
            fence: Some(1),
            remaining: Some(Duration::from_secs(12)),
        };
        assert_eq!(
            to_text("k", "sqlite", Some(&info)),
            r#"lock "k": held, fence 1024, lease left 12s (sqlite)"#
        );
        assert_eq!(to_text("k", "sqlite", None), r#"lock "k": free (sqlite)"#);
    }
}
