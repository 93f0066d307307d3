//! A minimal RESP2 client for the lock path: pooled connections, each request written and its
//! reply read by the calling task itself. A multiplexed connection routes every request
//! through a driver task and back, which is most of a lock cycle's client-side CPU; here there
//! is nothing between the caller and the socket.

use std::io;
use std::time::Duration;

mod codec;
mod conn;
mod master;
mod pool;

pub(crate) use conn::{Subscriber, Tls};
pub(crate) use pool::{Pool, MAX_OPEN};

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Simple(String),
    Array(Option<Vec<Reply>>),
    Error(String),
}

impl Reply {
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    pub(crate) fn ints(&self) -> Option<Vec<i64>> {
        match self {
            Reply::Array(Some(items)) => items.iter().map(Reply::int).collect(),
            _ => None,
        }
    }
}

/// Where and how to connect.
#[derive(Clone)]
pub(crate) struct ConnInfo {
    pub(crate) addr: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: u16,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// With Sentinel, where `addr` is looked up: at every new connection, so that a pool
    /// emptied after a failure reconnects to whichever node is master by then.
    pub(crate) sentinel: Option<SentinelInfo>,
    /// With Redis Cluster, the id the node at `addr` had in the slot map: every new
    /// connection checks it with `CLUSTER MYID`, so that a request meant for a node that is
    /// gone never runs on whatever server took its address since (another cluster's node, a
    /// plain Redis), where a `SET NX` would succeed.
    pub(crate) node_id: Option<String>,
    /// TLS for every connection (`rediss+sentinel://`, `rediss+cluster://`), the Sentinels'
    /// included.
    pub(crate) tls: Option<Tls>,
}

/// How to find the master through Sentinel.
#[derive(Clone)]
pub(crate) struct SentinelInfo {
    pub(crate) hosts: Vec<String>,
    pub(crate) master: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
}

/// Errors of the transport: the socket (retryable) or a reply that is an error.
#[derive(Debug)]
pub(crate) enum RespError {
    Io(io::Error),
    /// Writing the request failed, so no complete command reached the server (an idle
    /// connection that went stale, or one whose runtime is gone).
    Unsent(io::Error),
    Server(String),
}

/// How Redis words the refusal of a connection beyond `maxclients`.
pub(crate) const MAX_CLIENTS: &str = "ERR max number of clients reached";

impl From<io::Error> for RespError {
    fn from(e: io::Error) -> Self {
        RespError::Io(e)
    }
}

impl RespError {
    /// The server refused a new connection: it is at its client limit (`maxclients`).
    /// Nothing was sent on it, and a connection already open still works.
    pub(crate) fn refused(&self) -> bool {
        matches!(self, RespError::Server(text) if text.starts_with(MAX_CLIENTS))
    }

    /// The same error for another request of a batch (`io::Error` is not `Clone`).
    fn copy(&self) -> RespError {
        let io = |e: &io::Error| io::Error::new(e.kind(), e.to_string());
        match self {
            RespError::Io(e) => RespError::Io(io(e)),
            RespError::Unsent(e) => RespError::Unsent(io(e)),
            RespError::Server(s) => RespError::Server(s.clone()),
        }
    }
}
