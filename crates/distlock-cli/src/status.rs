//! `distlock status`: is a lock held, by which fence, for how much longer.

use distlock::LockInfo;

use crate::config::{Failure, Global};
use crate::run::describe_holder;
use crate::util::{holder_fence, json_opt, json_string, out};

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

/// One JSON object. `fence` is what a `distlock run` holder sees in `DISTLOCK_FENCE`;
/// `backend_fence` is the backend's own counter.
fn to_json(key: &str, prefix: &str, backend: &str, info: Option<&LockInfo>) -> String {
    let fence = info.and_then(|i| i.fence);
    let remaining = info.and_then(|i| i.remaining).map(|r| r.as_millis());
    format!(
        "{{\"key\":{},\"prefix\":{},\"held\":{},\"fence\":{},\"backend_fence\":{},\"remaining_ms\":{},\"backend\":{}}}",
        json_string(key),
        json_string(prefix),
        info.is_some(),
        json_opt(fence.map(holder_fence)),
        json_opt(fence),
        json_opt(remaining),
        json_string(backend),
    )
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
