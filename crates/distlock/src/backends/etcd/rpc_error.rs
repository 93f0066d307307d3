//! How an etcd request fails ([`RpcError`]) and what that means for the crate's [`Error`]:
//! shared by the tonic client and the hand-written unary path.

use std::fmt;

use tonic::{Code, Status};

use super::options::KIND;
use crate::error::Error;

/// How a request failed, before it becomes an [`Error`] (see [`map_err`]).
#[derive(Debug)]
pub(super) enum RpcError {
    /// The server, or the transport below the call, answered with this status.
    Status(Status),
    /// The request did not finish in its time.
    TimedOut,
    /// A keep-alive found the lease gone.
    LeaseNotFound,
    /// A stream ended before it could be used.
    Closed(&'static str),
    /// Settings that cannot work (an endpoint, TLS material).
    Config(String),
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcError::Status(s) => write!(f, "{:?}: {}", s.code(), s.message()),
            RpcError::TimedOut => f.write_str("request timed out"),
            RpcError::LeaseNotFound => f.write_str("lease not found"),
            RpcError::Closed(what) => f.write_str(what),
            RpcError::Config(m) => f.write_str(m),
        }
    }
}

impl From<Status> for RpcError {
    fn from(s: Status) -> Self {
        RpcError::Status(s)
    }
}

pub(super) type Result<T> = std::result::Result<T, RpcError>;

/// The crate's error for a failed request: retryable unless the server refused it.
pub(super) fn map_err(e: RpcError) -> Error {
    match e {
        RpcError::Status(status) => {
            let msg = status.message();
            let code = status.code();
            if code == Code::Unauthenticated
                || code == Code::PermissionDenied
                || msg.contains("authentication failed")
                || msg.contains("permission denied")
                || msg.contains("user name is empty")
            {
                return Error::backend(KIND, format!("authentication or permission failed: {msg}"));
            }
            if matches!(
                code,
                Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange
            ) {
                return Error::backend(KIND, msg.to_owned());
            }
            Error::unavailable(KIND, msg.to_owned())
        }
        RpcError::Config(m) => Error::config(m),
        e => Error::unavailable(KIND, e.to_string()),
    }
}

/// Whether the lease a request named is gone (expired or revoked).
pub(super) fn is_lease_not_found(e: &RpcError) -> bool {
    match e {
        RpcError::Status(s) => s.message().contains("lease not found"),
        RpcError::LeaseNotFound => true,
        _ => false,
    }
}

/// Whether a request failed because no connection could be made: it never reached a server,
/// so it can go to another endpoint (the balancer still offers a member that is down).
pub(super) fn is_connect_error(e: &RpcError) -> bool {
    match e {
        RpcError::Status(s) => {
            let m = s.message();
            s.code() == Code::Unavailable
                && (m.contains("connect") || m.contains("Connection refused"))
        }
        _ => false,
    }
}
