//! The backend's shared state ([`Postgres`]), behind the `Arc` that every clone, the pool's
//! loans and the listening task hold. Apart from `mod.rs` so that the parts (statements, listener)
//! import it from here and nothing imports back from the module root; it imports only the
//! pool, which needs nothing of it.

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

use tokio::sync::{oneshot, watch};

use super::places::Waits;
use super::pool::Pool;
use crate::backends::sql::dialect::Pg;
use crate::backends::sql::lease_table::Common;

pub(super) const KIND: &str = "postgres";

/// The listening connection's state (see `listen.rs`): the generation of the current `LISTEN`
/// (0 while down).
pub(super) struct ListenerHandle {
    pub(super) up: watch::Receiver<u64>,
    pub(super) _stop: oneshot::Sender<()>,
}

/// The PostgreSQL engine of [`PostgresBackend`](super::PostgresBackend): its pool, listening
/// connection and statements. Opaque: it only names the backend's type.
pub struct Postgres {
    /// The server, the options and the table's bookkeeping, as every engine has them.
    pub(super) common: Common,
    pub(super) sql: Pg,
    /// The connection pool; its manager holds the connection settings and the transport.
    pub(super) pool: Pool,
    pub(super) listener: OnceLock<ListenerHandle>,
    /// The NOTIFY channel of this table.
    pub(super) listen_channel: String,
    /// Identifies this backend instance in NOTIFY payloads, to skip its own.
    pub(super) origin: String,
    /// This backend's own channel (`<listen_channel>_<origin>`), on which a release tells one of
    /// its waiters that it is next (see `wait.rs`).
    pub(super) wake_channel: String,
    /// This backend's waiters in the wait table.
    pub(super) waits: Waits,
    /// Whether the holders' descriptions have their place (Spring: `<table>_OWNERS`); a
    /// Spring table made by Spring, with `create_table=false`, works without.
    pub(super) described: AtomicBool,
}
