//! The backend's shared state ([`MySql`]), behind the `Arc` that every clone and the doorbell
//! tasks hold. Apart from `mod.rs` so that the parts (connections) import it from here and
//! nothing imports back from the module root.

use std::sync::Arc;

use super::doorbell::Doorbells;
use crate::backends::sql::dialect::{My, Prepared};
use crate::backends::sql::lease_table::Common;

pub(super) const KIND: &str = "mysql";

/// The MySQL/MariaDB engine of [`MySqlBackend`](super::MySqlBackend): its sessions, doorbells
/// and statements. Opaque: it only names the backend's type.
pub struct MySql {
    /// The server, the options and the table's bookkeeping, as every engine has them.
    pub(super) common: Common,
    pub(super) sql: My,
    pub(super) doorbells: Arc<Doorbells>,
    /// `database.table`, which names the doorbells (see [`MySql::doorbell`]).
    pub(super) qualified_table: String,
    /// The common acquisition and the release, prepared (native layout).
    pub(super) acquire_prepared: Prepared,
    /// The same for a waiter that another process is ahead of (see `Doorbells::behind`).
    pub(super) acquire_deferring: Prepared,
    pub(super) release_prepared: Prepared,
    /// A lone reader's hold in the key's row (see `My::acquire_lone_prepared`).
    pub(super) acquire_lone: Prepared,
}
