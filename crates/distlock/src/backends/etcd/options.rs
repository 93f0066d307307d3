//! What a user may set ([`EtcdOptions`]) and the fixed timings of the backend. Kept apart from
//! `mod.rs` so that the parts (address parsing, the client, sessions) can read them without
//! importing back from the module root.

use std::fmt;
use std::time::Duration;

pub(super) const KIND: &str = "etcd";
/// How many contenders one range asks for (the holder, or the predecessor, is among the first).
pub(super) const PEEK: i64 = 16;
/// Keys checked by one read-only transaction when many leases are renewed at once (etcd
/// allows 128 operations per transaction by default).
pub(super) const CHECK_CHUNK: usize = 100;
/// A waiter whose subscription is gone and who has not tried for this long gave up without
/// saying so: its key is deleted so that it does not hold up the queue.
pub(super) const WAITER_IDLE: Duration = Duration::from_secs(30);
/// After a failed attempt the registry may have given up without knowing that the key was
/// queued: unless it tries again (or subscribes) within this time, the key is deleted.
pub(super) const ORPHAN_GRACE: Duration = Duration::from_secs(3);
/// A session lease without keys for this long is revoked.
pub(super) const SESSION_IDLE: Duration = Duration::from_secs(60);

/// Connection and session settings of [`EtcdBackend`](super::EtcdBackend).
#[derive(Clone)]
pub struct EtcdOptions {
    /// Time allowed to connect (default 5 s).
    pub connect_timeout: Duration,
    /// Time allowed for one request (default 5 s).
    pub request_timeout: Duration,
    /// Shortest TTL of a session lease (default 2 s; etcd raises shorter ones to its own
    /// minimum, 1.5 × the election timeout). A process that dies holding a lock blocks
    /// others for up to its session TTL.
    pub min_session_ttl: Duration,
    /// TTL of the lease a waiting key is attached to (default 2 s, whole seconds, at least
    /// one; etcd raises shorter ones to its own minimum): a waiter that dies leaves the queue
    /// this long after its last keep-alive, however long the lease it waited for. A waiter
    /// that reaches the head moves its key to the session of its lease before it holds.
    pub waiter_ttl: Duration,
    /// For `etcds://`: the PEM certificate(s) of the authority that signed the servers'
    /// certificates, when it is not a public one (the URL's `ca_file` does the same).
    pub tls_ca_pem: Option<Vec<u8>>,
    /// For `etcds://`: a client certificate and its private key (PEM), for servers that
    /// require one (the URL's `cert_file` and `key_file` do the same).
    pub tls_client_identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            min_session_ttl: Duration::from_secs(2),
            waiter_ttl: Duration::from_secs(2),
            tls_ca_pem: None,
            tls_client_identity_pem: None,
        }
    }
}

impl fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("min_session_ttl", &self.min_session_ttl)
            .field("waiter_ttl", &self.waiter_ttl)
            .field("tls_ca_pem", &self.tls_ca_pem.as_ref().map(|_| "…"))
            .field(
                "tls_client_identity_pem",
                &self.tls_client_identity_pem.as_ref().map(|_| "…"),
            )
            .finish()
    }
}
