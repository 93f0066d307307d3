//! What the rest of the backend takes from the driver: the `ssl-mode` choices, the classes of
//! its errors (the retry rules), closing a stalled connection, the statement forms and integer
//! cells. Apart from `conn.rs` so that the sessions, which `conn.rs` runs statements on, need
//! nothing back from it.

use std::time::Duration;

use mysql_async::{Conn, Row, Value};

use crate::backends::sql::dialect::Prepared;
use crate::error::{Error, Result};

/// `ssl-mode` in the URL, as MySQL's client names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl SslMode {
    pub(super) fn parse(value: &str) -> Result<Self> {
        Ok(match value.replace('-', "_").as_str() {
            "disabled" => SslMode::Disabled,
            "preferred" => SslMode::Preferred,
            "required" => SslMode::Required,
            "verify_ca" => SslMode::VerifyCa,
            "verify_identity" => SslMode::VerifyIdentity,
            other => {
                return Err(Error::config(format!(
                    "mysql URL: ssl-mode must be disabled, preferred, required, verify_ca or \
                     verify_identity, got {other:?}"
                )))
            }
        })
    }
}

/// How an error is handled.
pub(super) enum Class {
    RolledBack,
    Connection,
    NoTable,
    Permanent,
}

pub(super) fn classify(e: &mysql_async::Error) -> Class {
    match e {
        mysql_async::Error::Server(s) => match s.code {
            // Deadlock victim, lock wait timeout: the statement was rolled back.
            1213 | 1205 | 1040 => Class::RolledBack,
            // Server shutting down, connection killed (MariaDB 1927), query interrupted.
            1053 | 1927 | 1317 | 2006 | 2013 => Class::Connection,
            1146 => Class::NoTable,
            _ => Class::Permanent,
        },
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => Class::Connection,
        _ => Class::Permanent,
    }
}

/// Closes a connection that may be stalled without waiting for it: `disconnect` marks it
/// disconnected before it writes anything, so when the short wait for the goodbye ends, the
/// socket is dropped.
pub(super) fn discard(conn: Conn) {
    let close = async move {
        let _ = tokio::time::timeout(Duration::from_millis(100), conn.disconnect()).await;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(close);
        }
        Err(_) => drop(close),
    }
}

/// A statement to run: text (one or more statements), a transaction of several (which
/// closes its connection on any error: statements after a failed one are not run, so the
/// transaction may still be open), or prepared with its values.
#[derive(Clone, Copy)]
pub(super) enum Sql<'a> {
    Text(&'a str),
    Transaction(&'a str),
    Prepared(&'a Prepared, &'a [Value]),
}

pub(super) fn int(row: &Row, i: usize) -> Option<i64> {
    match row.get_opt::<Option<i64>, usize>(i) {
        Some(Ok(v)) => v,
        _ => row
            .get_opt::<Option<String>, usize>(i)
            .and_then(|r| r.ok().flatten())
            .and_then(|s| s.split('.').next().and_then(|n| n.parse().ok())),
    }
}
