//! `distlock list` (the locks held under the prefix) and `distlock unlock K --force` (an
//! operator's removal of a lock, whoever holds it).

use distlock::LockName;

use crate::config::{Failure, Global, DEFAULT_KIND};
use crate::run::describe_holder;
use crate::status::{to_json, EXIT_FREE};
use crate::util::out;

/// Prints every lock held under the prefix, one per line (text or `status --json` objects),
/// ordered by key; exit 0.
pub async fn list(global: &Global, json: bool) -> Result<i32, Failure> {
    let (mut locks, kind) = match global.registry_if_any().await? {
        Some(registry) => {
            let backend = registry.backend();
            (backend.list(&global.prefix).await?, backend.kind())
        }
        None => (Vec::new(), DEFAULT_KIND),
    };
    locks.sort_by(|a, b| a.key.cmp(&b.key));
    for lock in &locks {
        if json {
            out(&to_json(&lock.key, &global.prefix, kind, Some(&lock.info)));
        } else {
            out(&format!("{:?}: {}", lock.key, describe_holder(&lock.info)));
        }
    }
    if !json && locks.is_empty() {
        out(&format!(
            "no locks held under prefix {:?} ({kind})",
            global.prefix
        ));
    }
    Ok(0)
}

/// Removes `key`'s lock whatever its holders (they find it lost at their next renewal) and
/// prints what it removed; exit 0 when something was held, 3 when the lock was free.
pub async fn unlock(global: &Global, key: &str) -> Result<i32, Failure> {
    let name = LockName::new(global.prefix.as_str(), key)?;
    let Some(registry) = global.registry_if_any().await? else {
        out(&format!(
            "lock {key:?} was not held; nothing removed ({DEFAULT_KIND})"
        ));
        return Ok(EXIT_FREE);
    };
    let backend = registry.backend();
    let before = backend.inspect(&name).await?;
    let removed = backend.force_release(&name).await?;
    match (removed, before) {
        (true, Some(info)) => {
            out(&format!(
                "removed lock {key:?}: it was {} ({})",
                describe_holder(&info),
                backend.kind()
            ));
            Ok(0)
        }
        (true, None) => {
            out(&format!("removed lock {key:?} ({})", backend.kind()));
            Ok(0)
        }
        (false, _) => {
            out(&format!(
                "lock {key:?} was not held; nothing removed ({})",
                backend.kind()
            ));
            Ok(EXIT_FREE)
        }
    }
}
