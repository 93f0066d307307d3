//! ShedLock's table as a layout of the PostgreSQL and MySQL/MariaDB backends
//! ([`SqlOptions::shedlock_compatible`](super::SqlOptions::shedlock_compatible), URL
//! `?layout=shedlock`), so that ShedLock's JDBC lock provider (`JdbcTemplateLockProvider`,
//! with `usingDbTime()`) and distlock on the same database exclude each other.
//!
//! The table (default `shedlock`, `?table=` changes it) is ShedLock's documented one, created
//! when missing (an existing one made for ShedLock is used as it is):
//!
//! | column | type | value written by distlock |
//! |---|---|---|
//! | `name` | `VARCHAR(64)` primary key | the key (with the default prefix), else `<prefix>:<key>` |
//! | `lock_until` | `TIMESTAMP(3)` | end of the lease while held; the release time after a release |
//! | `locked_at` | `TIMESTAMP(3)` | when it was taken |
//! | `locked_by` | `VARCHAR(255)` | `<owner description> #<token, 32 hex digits>` |
//!
//! - **Times** are UTC wall-clock readings of the database's clock, as ShedLock's
//!   `usingDbTime()` writes them: PostgreSQL `timezone('utc', CURRENT_TIMESTAMP)`, MySQL
//!   `UTC_TIMESTAMP(3)`. A lease end is rounded up to the millisecond and a release time
//!   down, so that the server never ends a lease before its holder reckons, and a released
//!   row is free at once. The clients' clocks never matter to distlock (a ShedLock client
//!   without `usingDbTime()` writes its own clock's UTC time: keep the clocks in step then).
//! - **Held** means `lock_until` is in the future. Acquisition is ShedLock's statement: an
//!   insert of the row that, when the row exists, takes it only if `lock_until <= now`
//!   (PostgreSQL `INSERT … ON CONFLICT (name) DO UPDATE … WHERE lock_until <= now`; MySQL
//!   `INSERT … ON DUPLICATE KEY UPDATE` with `IF()` on each column), or if distlock's own
//!   token holds it (a repeated attempt).
//! - **Release** sets `lock_until` to now (ShedLock's `GREATEST(locked_at + lock-at-least,
//!   now)` with no lock-at-least: the CLI's `--at-least` keeps holding until its deadline
//!   instead), matching `name` and the token in `locked_by`. The row is never deleted: a
//!   ShedLock process that has seen a row never inserts it again, it only updates it.
//!   `force_release` does the same whoever holds it.
//! - **Renewal** moves `lock_until` to now + lease while it is still ahead (ShedLock's
//!   extend statement).
//! - **Owners**: ShedLock matches its release on `name` and `locked_by` alone and writes its
//!   host name there, so distlock's `locked_by` carries the hold's token as well, which keeps
//!   every owner check exact and keeps a ShedLock process from releasing distlock's hold. The
//!   description is cut so that the whole fits 255 characters. `inspect` and `list` show the
//!   description of distlock's rows and the whole `locked_by` (ShedLock's host name) of the
//!   others.
//! - **Prefix**: ShedLock's names have none. The registry's default prefix `lock` (also the
//!   CLI's `--prefix` default) is ShedLock's namespace: the key alone is the row's `name`. Any
//!   other prefix `p` writes `p:<key>`, so that registries with distinct prefixes keep
//!   distinct locks as on every other backend (a ShedLock job named `p:<key>` is the same
//!   lock). `list("lock")` shows every held row by its whole `name`; `list(p)` the rows
//!   whose name starts with `p:`, without it. `?region=` is refused.
//! - **Limits**: the mutex only (read-write locks and semaphores answer
//!   [`Error::Unsupported`](crate::Error)); a name longer than 64 characters is
//!   [`Error::InvalidKey`](crate::Error) (the capabilities' `max_key_len` says 64). The table has no fence column: the fence reported is
//!   `locked_at` in microseconds, which increases only as far as the database's clock does, so
//!   the capabilities say [`Fencing::None`](crate::Fencing). On MySQL/MariaDB `name` has the
//!   table's collation: with the usual case-insensitive ones, keys that differ only in case
//!   (or in trailing spaces) are one lock, as they are for ShedLock. MySQL converts
//!   `TIMESTAMP` values through the session's time zone: every client (ShedLock's too) must
//!   use the same one, the server's default (distlock sets none), ideally UTC.
//! - **Waiting**: distlock's releases wake distlock's waiters as in the other layouts
//!   (PostgreSQL `NOTIFY`, MySQL's doorbell); ShedLock's releases are noticed by polling (at
//!   most every 500 ms). ShedLock itself never waits: it skips a run when the lock is busy.

use crate::backend::{Owner, Token};
use crate::error::{Error, Result};

/// Characters of ShedLock's `name` column.
pub const NAME_CHARS: usize = 64;
/// Characters of ShedLock's `locked_by` column.
pub const LOCKED_BY_CHARS: usize = 255;
/// What follows the description in `locked_by`: `" #"` and the token's 32 hex digits.
const TOKEN_PART: usize = 34;

/// The namespace of `prefix` in ShedLock's table: none (`""`, bare names, ShedLock's own) for
/// the registry's default prefix `lock` and the empty prefix, else the prefix itself.
pub(crate) fn namespace(prefix: &str) -> &str {
    if prefix == super::REGISTRY_DEFAULT_PREFIX {
        ""
    } else {
        prefix
    }
}

/// The `name` of a lock: the bare key in the default namespace, else `<prefix>:<key>`;
/// refused when it does not fit the column.
pub(crate) fn row_name(prefix: &str, key: &str) -> Result<String> {
    let name = match namespace(prefix) {
        "" => key.to_owned(),
        ns => format!("{ns}:{key}"),
    };
    check_name(&name)?;
    Ok(name)
}

/// Refuses a key that does not fit ShedLock's `name` column.
pub(crate) fn check_name(key: &str) -> Result<()> {
    let chars = key.chars().count();
    if chars > NAME_CHARS {
        return Err(Error::InvalidKey(format!(
            "ShedLock's name column holds at most {NAME_CHARS} characters; the key {key:?} has \
             {chars}"
        )));
    }
    Ok(())
}

/// The `locked_by` value of a hold: the holder's description, cut to fit, then `" #"` and the
/// token.
pub(crate) fn locked_by(described: &str, token: Token) -> String {
    let room = LOCKED_BY_CHARS - TOKEN_PART;
    let cut: String = described.chars().take(room).collect();
    format!("{cut} #{token}")
}

/// Who a row's `locked_by` names: the description of distlock's holds, the whole value
/// (ShedLock writes its host name) otherwise.
pub(crate) fn shown_owner(locked_by: &[u8]) -> String {
    if locked_by.len() > TOKEN_PART {
        let (described, tail) = locked_by.split_at(locked_by.len() - TOKEN_PART);
        let hex = &tail[2..];
        if tail.starts_with(b" #")
            && hex
                .iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        {
            return Owner::shown(described);
        }
    }
    Owner::shown(locked_by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_by_carries_the_token_and_shows_the_description() {
        let token = Token::from(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef_u128);
        let v = locked_by("web-1:42", token);
        assert_eq!(v, "web-1:42 #0123456789abcdef0123456789abcdef");
        assert_eq!(shown_owner(v.as_bytes()), "web-1:42");
        assert_eq!(shown_owner(b"host-7"), "host-7");
        assert_eq!(shown_owner(b""), "unknown");
        let long = "x".repeat(300);
        assert_eq!(locked_by(&long, token).chars().count(), LOCKED_BY_CHARS);
    }

    #[test]
    fn long_names_are_refused() {
        assert!(check_name(&"k".repeat(NAME_CHARS)).is_ok());
        assert!(matches!(
            check_name(&"k".repeat(NAME_CHARS + 1)),
            Err(Error::InvalidKey(_))
        ));
    }
}
