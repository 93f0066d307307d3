//! Every SQL statement of the PostgreSQL, MySQL/MariaDB and SQLite backends, side by side: the
//! one place where the dialects differ. All implement the same lease table (see the
//! [module docs](super)); the differences are the clock expressions, the upsert syntax, the
//! identifier quoting and the column types of the key (and SQLite, alone on one machine, has no
//! `wanted_ms` column and counts fences from 1).
//!
//! PostgreSQL statements are prepared once per connection and take `$n` parameters. MySQL
//! statements are built per call as text with every value written as a literal that cannot
//! break out of it (hex literals for keys and regions, hex digits for tokens, integers), so
//! that a statement and the `SELECT` reading its outcome travel in one round trip.

// The dialects stay side by side whatever backends a build enables, so a build with only some
// of the SQL features leaves the others' statements unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code, unused_imports)
)]

// One file per dialect: each is read on its own when a backend's statement changes, and the
// shared lease-table design is described once, here and in the `sql` module docs.
mod lite;
mod my;
mod pg;
mod pg_shedlock;
mod pg_text;
mod pg_wait;
#[cfg(test)]
mod tests;

pub(crate) use self::lite::Lite;
pub(crate) use self::my::{My, MyLock, MyOutcome, MyShareOutcome, Prepared, ShareAsk};
pub(crate) use self::pg::Pg;
pub(crate) use self::pg_wait::WAIT_ENTRY_MS;
