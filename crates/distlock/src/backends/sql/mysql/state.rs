//! The backend's shared state ([`MySql`]), behind the `Arc` that every clone and the doorbell
//! tasks hold. Apart from `mod.rs` so that the parts (connections) import it from here and
//! nothing imports back from the module root.

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::doorbell::Doorbells;
use crate::backend::ReleaseSignals;
use crate::backends::sql::dialect::{My, Prepared};
use crate::backends::sql::kinds::WriterPlaces;
use crate::backends::sql::SqlOptions;

pub(super) const KIND: &str = "mysql";

/// The MySQL/MariaDB engine of [`LeaseTable`](crate::backends::sql::LeaseTable).
pub struct MySql {
    pub(super) target: String,
    pub(super) user: String,
    pub(super) password: Option<String>,
    pub(super) options: SqlOptions,
    pub(super) sql: My,
    pub(super) ready: tokio::sync::Mutex<bool>,
    pub(super) ready_fast: AtomicBool,
    pub(super) signals: Arc<ReleaseSignals>,
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
    /// Whether the side table (native: the holds; Spring: the key names) exists.
    pub(super) side_table: AtomicBool,
    pub(super) writers: WriterPlaces,
    /// Spring mode: the rows (LOCK_KEY, REGION) whose key name this backend recorded.
    pub(super) named: Mutex<HashSet<(String, String)>>,
}
