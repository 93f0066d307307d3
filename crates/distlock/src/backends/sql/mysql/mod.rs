//! MySQL / MariaDB backend: the lease table of the [`sql`](super) module over `mysql_async`.
//! MySQL has no `NOTIFY`: waiters are woken through a `GET_LOCK` "doorbell" per lock that the
//! holder's backend keeps on its statement connection (see the `doorbell` module), and
//! poll as a fallback (the registry does that, jittered, backing off); releases made through
//! this backend wake waiters of the same process at once.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! use distlock::LockRegistry;
//! use distlock::backends::mysql::MySqlBackend;
//! let backend = MySqlBackend::connect("mysql://app:secret@127.0.0.1:3306/app").await?;
//! let registry = LockRegistry::new(backend);
//! let guard = registry.obtain("voucher:42")?.lock().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Every statement runs in autocommit mode on one of the backend's `pool_size` sessions
//! (default one), connections it opens on first use and keeps (see `session`); with the
//! waiters' one listener, a backend uses two connections to the server by default, whatever
//! the number of keys it holds or waits for. The common acquisition and the release are one `UPDATE` each, whose outcome comes back
//! in the OK packet (matched rows and a `LAST_INSERT_ID(expr)` value), without a result set.

use std::sync::Arc;
use std::time::Duration;

use super::dialect::MyLock;
use super::kinds::{place, share_owner, HeldRow, Place, Share};
use super::lease_table::{capabilities, Common, Engine, LeaseTable, Take};
use super::shedlock::shown_owner;
use super::{channel, fence_from, lease_ms, millis};
use crate::backend::{
    Attempt, Capabilities, ListedLock, LockInfo, LockKind, LockName, Owner, ReleaseSubscription,
    Released, Renewal, Token,
};
use crate::error::Result;

// One job per file, so that each reads on its own: `connect` opens the backend, `acquire`
// makes the attempts; this file keeps the type, its `Engine` operations and the waiters'
// subscription.
mod acquire;
mod conn;
mod connect;
mod doorbell;
mod driver;
mod session;
mod state;
#[cfg(test)]
mod tests;

use self::doorbell::{doorbell_name, LISTEN_WAIT_S};
use self::driver::int;
use self::session::{Failed, Ring};
pub use self::state::MySql;
use self::state::KIND;

/// The URL schemes of this backend.
pub const SCHEMES: &[&str] = &["mysql", "mariadb"];
/// One entry of a batch renewal: region, key, owner and lease in milliseconds.
type Renewed = (String, String, String, i64);

/// Renewals per `UPDATE` statement in [`Backend::extend_many`](crate::Backend::extend_many)
/// (one commit each).
const BATCH: usize = 2500;

/// Locks in a MySQL or MariaDB lease table; see the [module docs](self).
///
/// Cloning is cheap and shares the connections. `Debug` never shows the password.
pub type MySqlBackend = LeaseTable<MySql>;

impl MySql {
    /// The `GET_LOCK` name that rings when the lock of [`row_key`](Engine::row_key) `(a, b)` is
    /// released.
    fn doorbell(&self, a: &str, b: &str) -> String {
        doorbell_name(&self.qualified_table, a, b)
    }

    /// The token a hold of `name` is stored under, and its share when it is a read hold or a
    /// permit (then in the holds table, and only where the layout has one); else the row's.
    fn stored_token(&self, name: &LockName, token: Token) -> Result<(String, Option<Share>)> {
        match place(name) {
            Place::Shared(share) => {
                self.check_kind(name)?;
                Ok((share_owner(name, token), Some(share)))
            }
            Place::Row => Ok((self.owner(name, token), None)),
        }
    }
}

/// Reads a row of the inspect and list statements (native layout) from column `at` on.
fn held_row(row: &mysql_async::Row, at: usize) -> HeldRow {
    let token = row
        .get_opt::<Option<String>, usize>(at)
        .and_then(|v| v.ok())
        .flatten()
        .unwrap_or_default();
    HeldRow {
        token,
        fence: int(row, at + 1).unwrap_or(-1),
        remaining_ms: int(row, at + 2).unwrap_or(0),
        shares: int(row, at + 3).unwrap_or(0),
        permits: int(row, at + 4),
        share_remaining_ms: int(row, at + 5),
        writers: int(row, at + 6).unwrap_or(0),
        share_owners: bytes(row, at + 7),
        owner: bytes(row, at + 8),
    }
}

/// A column of bytes, `None` for NULL (or a value that is not bytes).
fn bytes(row: &mysql_async::Row, i: usize) -> Option<Vec<u8>> {
    row.get_opt::<Option<Vec<u8>>, usize>(i)
        .and_then(|v| v.ok())
        .flatten()
}

/// What a Spring- or ShedLock-layout row says of its holder from column `at` on: distlock's
/// description, else the `CLIENT_ID` (a Spring client's hold) or the `locked_by` (the
/// ShedLock layout's column `at` is always NULL; `shown_owner` keeps the description part of
/// distlock's `locked_by`, and shows any other value, a `CLIENT_ID` too, whole).
fn spring_owner(row: &mysql_async::Row, at: usize) -> String {
    if bytes(row, at).is_none() {
        return shown_owner(bytes(row, at + 1).as_deref().unwrap_or_default());
    }
    let shown = bytes(row, at).or_else(|| bytes(row, at + 1));
    Owner::shown(shown.as_deref().unwrap_or_default())
}

/// The matched rows and `LAST_INSERT_ID` of statement `i` of a packet.
fn statement(out: &session::Outcome, i: usize) -> (u64, Option<u64>) {
    out.statements.get(i).copied().unwrap_or((0, None))
}

/// A column of bytes (a key) as text.
fn text(row: &mysql_async::Row, i: usize) -> Option<String> {
    row.get_opt::<Option<Vec<u8>>, usize>(i)
        .and_then(|v| v.ok())
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}

impl Engine for MySql {
    const KIND: &'static str = KIND;
    const NAME: &'static str = "MySqlBackend";

    fn capabilities(&self) -> Capabilities {
        // Waiting processes queue on the lock's doorbell turnstile, which the server grants in
        // arrival order: one process is woken per release, first come, first served. A
        // waiter's fallback poll that finds the row free between two rings can still take it
        // first. Spring mode queues nobody (Spring's clients would not respect the turnstile),
        // so it promises no order.
        capabilities(KIND, &self.common.options)
            .fifo(self.common.options.native())
            .owners(true)
    }

    fn common(&self) -> &Common {
        &self.common
    }

    async fn take_share(&self, take: Take<'_>, share: Share) -> Result<Attempt> {
        self.take_shared(take, share).await
    }

    async fn take_row(&self, take: Take<'_>) -> Result<Attempt> {
        self.take_exclusive(take).await
    }

    /// Other processes' releases ring the lock's doorbell, on which a waiter connection
    /// listens while anybody is subscribed.
    async fn listen(
        self: &Arc<Self>,
        name: &LockName,
        _waiter: Token,
    ) -> Result<Option<ReleaseSubscription>> {
        let ch = channel(name);
        let (a, b) = self.row_key(name)?;
        let doorbell = self.doorbell(&a, &b);
        let sql = self
            .sql
            .doorbell_wait(&MyLock::new(&a, &b, ""), &doorbell, LISTEN_WAIT_S);
        self.doorbells
            .listen(doorbell, ch, sql, &self.common.signals);
        Ok(None)
    }

    async fn leave_place(&self, name: &LockName, token: Token) -> Result<()> {
        if !self.common.writers.take(token) {
            return Ok(());
        }
        let (a, b) = self.row_key(name)?;
        let waiter = token.to_string();
        let sql = self.sql.leave(&MyLock::new(&a, &b, &waiter));
        // Readers kept out may come in: those of this process are woken here, the others'
        // doorbell listeners see the row free of a waiting writer.
        self.run("leave_queue", &sql, true).await?;
        self.common.signals.fire(&channel(name));
        Ok(())
    }

    async fn held_keys(&self, region: String) -> Result<Vec<ListedLock>> {
        let out = self.run("list", &self.sql.list(&region), true).await?;
        let mut listed = Vec::with_capacity(out.rows.len());
        for row in &out.rows {
            if !self.common.options.native() {
                let Some(key) = text(row, 0).or_else(|| text(row, 1)) else {
                    continue;
                };
                listed.push(ListedLock {
                    key,
                    info: LockInfo::new(
                        Some(fence_from(KIND, int(row, 2).unwrap_or(-1))?),
                        int(row, 3).map(millis),
                    )
                    .with_kind(LockKind::Mutex)
                    .with_holders(1)
                    .with_owners([spring_owner(row, 4)]),
                });
            } else if let (Some(key), Some(info)) = (text(row, 0), held_row(row, 1).info(KIND)?) {
                listed.push(ListedLock { key, info });
            }
        }
        Ok(listed)
    }

    async fn release_token(&self, name: &LockName, token: Token) -> Result<Released> {
        let (a, b) = self.row_key(name)?;
        let (owner, shared) = self.stored_token(name, token)?;
        let lock = MyLock::new(&a, &b, &owner);
        if let Some(share) = shared {
            if share.is_read() {
                // A lone reader's release is the mutex's; a reader that was joined is in the
                // holds table.
                let out = self
                    .run_prepared("release", &self.release_prepared, &lock, 0, false)
                    .await?;
                if out.affected > 0 {
                    return Ok(Released {
                        was_held: true,
                        contended: out.last_insert_id == Some(2),
                    });
                }
            }
            let sql = self.sql.release_share(&lock);
            let out = self.run_transaction("release", &sql, false).await?;
            let (matched, code) = statement(&out, 1);
            let code = code.unwrap_or(0);
            return Ok(Released {
                was_held: matched > 0,
                contended: code & 2 == 2,
            });
        }
        let doorbell = self.doorbell(&a, &b);
        let out = if self.doorbells.is_armed(&doorbell) {
            // Release and ring in one round trip, on the connection that holds the doorbell.
            let sql = self.sql.release(&lock);
            match self.doorbells.exec(&doorbell, sql, Ring::Disarm).await {
                Ok(out) => out,
                // Nothing was sent (no connection): the release's own retries, without the
                // doorbell, which no connection holds any more.
                Err(Failed { sent: false, .. }) => self.release_plain(&lock).await?,
                Err(Failed { error, .. }) => return Err(self.error("release", &error)),
            }
        } else {
            self.release_plain(&lock).await?
        };
        let (was_held, contended) = if !self.common.options.native() {
            let row = out.rows.first();
            let held = row.and_then(|r| int(r, 0)).unwrap_or(0) > 0;
            (held, row.and_then(|r| int(r, 1)).unwrap_or(0) > 0)
        } else {
            (out.affected > 0, out.last_insert_id == Some(2))
        };
        if !was_held {
            return Ok(Released::default());
        }
        Ok(Released {
            was_held,
            contended,
        })
    }

    async fn extend_token(&self, name: &LockName, token: Token, lease: Duration) -> Result<bool> {
        let (a, b) = self.row_key(name)?;
        let (owner, shared) = self.stored_token(name, token)?;
        let lock = MyLock::new(&a, &b, &owner);
        if let Some(share) = shared {
            // A lone reader's renewal is the mutex's.
            if share.is_read()
                && self
                    .run("extend", &self.sql.extend(&lock, lease_ms(lease)), true)
                    .await?
                    .affected
                    > 0
            {
                return Ok(true);
            }
            let sql = self.sql.extend_share(&lock, lease_ms(lease));
            let out = self.run_transaction("extend", &sql, true).await?;
            return Ok(statement(&out, 2).0 > 0);
        }
        let sql = self.sql.extend(&lock, lease_ms(lease));
        Ok(self.run("extend", &sql, true).await?.affected > 0)
    }

    async fn inspect_lock(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (a, b) = self.row_key(name)?;
        let sql = self.sql.inspect(&MyLock::new(&a, &b, ""));
        let out = self.run("inspect", &sql, true).await?;
        let Some(row) = out.rows.first() else {
            return Ok(None);
        };
        if !self.common.options.native() {
            return Ok(Some(
                LockInfo::new(
                    Some(fence_from(KIND, int(row, 0).unwrap_or(-1))?),
                    int(row, 1).map(millis),
                )
                .with_kind(LockKind::Mutex)
                .with_holders(1)
                .with_owners([spring_owner(row, 2)]),
            ));
        }
        held_row(row, 0).info(KIND)
    }

    async fn force_delete(&self, name: &LockName) -> Result<bool> {
        let (a, b) = self.row_key(name)?;
        let sql = self.sql.force_delete(&MyLock::new(&a, &b, ""));
        let existed = if !self.common.options.native() {
            self.run("force_release", &sql, true).await?.affected > 0
        } else {
            let out = self.run_transaction("force_release", &sql, true).await?;
            out.rows.first().and_then(|r| int(r, 0)).unwrap_or(0) > 0
        };
        self.common.signals.fire(&channel(name));
        Ok(existed)
    }

    /// Up to 2500 exclusive renewals per `UPDATE … JOIN (…)` statement, read back in the same
    /// round trip; shared ones (a few: the readers of a registry share one hold) one
    /// transaction each, at once.
    async fn extend_all(&self, batch: Vec<Renewal>) -> Result<Vec<bool>> {
        let mut extended = vec![false; batch.len()];
        let shared: Vec<usize> = (0..batch.len())
            .filter(|&i| matches!(place(&batch[i].name), Place::Shared(_)))
            .collect();
        let renewed = futures_util::future::join_all(
            shared
                .iter()
                .map(|&i| self.extend_token(&batch[i].name, batch[i].token, batch[i].lease)),
        )
        .await;
        for (&i, r) in shared.iter().zip(renewed) {
            extended[i] = r?;
        }
        let idents: Vec<Option<Renewed>> = batch
            .iter()
            .map(|r| match place(&r.name) {
                Place::Shared(_) => None,
                Place::Row => self
                    .row_key(&r.name)
                    .ok()
                    .map(|(a, b)| (a, b, self.owner(&r.name, r.token), lease_ms(r.lease))),
            })
            .collect();
        let valid: Vec<(usize, &Renewed)> = idents
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i, e)))
            .collect();
        for chunk in valid.chunks(BATCH) {
            let locks: Vec<(MyLock<'_>, i64)> = chunk
                .iter()
                .map(|(_, (a, b, t, l))| (MyLock::new(a, b, t), *l))
                .collect();
            let sql = self.sql.extend_many(&locks);
            let out = self.run("extend_many", &sql, true).await?;
            for row in &out.rows {
                if let Some(i) = int(row, 0).and_then(|i| usize::try_from(i).ok()) {
                    if let Some((original, _)) = chunk.get(i) {
                        extended[*original] = true;
                    }
                }
            }
        }
        Ok(extended)
    }
}
