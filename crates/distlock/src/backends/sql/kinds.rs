//! How the lease tables carry every [`LockKind`] (native layouts of all three databases; the
//! Spring layout takes the mutex only): what the key's row says about the kind that holds it,
//! the holds table of readers, permits and waiting writers, and turning what the statements
//! read back into a [`LockInfo`]. The statements themselves are in `dialect/`.
//!
//! - The key's row in the lease table stays the one place every kind meets, so the mutex
//!   statements (and their cost) are unchanged: a mutex holder's `token` is its token in
//!   lower-case hex, a writer's the same token in upper case (so the row says which exclusive
//!   kind holds it, at no cost), and while readers or permit holders are in, `token` is a
//!   share mark ([`READ_MARK`], [`SEM_MARK`]) and `expires_ms` the longest lease among them:
//!   an exclusive attempt, ours or another client's, finds the row busy.
//! - The holds table has one row per shared hold (kind `r` or `s`, with its own lease, fence
//!   and the semaphore's permits) and one per waiting writer (kind `w`, a place that expires
//!   unless its attempts renew it).

use std::collections::HashSet;
use std::sync::Mutex;

use super::{fence_from, millis};
use crate::backend::{LockInfo, LockKind, LockName, Owner, Token};
use crate::error::{Error, Result};

/// The `token` of a key's row while readers hold it.
pub(crate) const READ_MARK: &str = "shared:read";
/// The `token` of a key's row while semaphore permits are held.
pub(crate) const SEM_MARK: &str = "shared:semaphore";
/// The start of a reader's id ([`share_owner`]). A key's row whose `token` is a reader's id
/// is held by that reader alone: the common case of a read lock costs two writes of the row,
/// as a mutex does, instead of two more in the holds table. A second reader moves the lone
/// one into the holds table (same id, lease and fence) and marks the row [`READ_MARK`].
pub(crate) const LONE_READER: &str = "r:";
/// The `kind` of a read hold in the holds table.
pub(crate) const READ: &str = "r";
/// The `kind` of a semaphore permit in the holds table.
pub(crate) const PERMIT: &str = "s";
/// The `kind` of a waiting writer's place in the holds table.
pub(crate) const WRITER: &str = "w";
/// How long a waiting writer's place keeps new readers out unless its next attempt renews it
/// (the registry attempts at least every 500 ms while it waits, and gives the place back when
/// it stops waiting; this only bounds a place nobody gave back).
pub(crate) const WRITER_PLACE_MS: i64 = 2000;

/// The holds table beside `table`: `<table>_holds`, shortened (with a hash of the whole name)
/// where that would exceed the 63 characters both servers take.
pub(crate) fn holds_table(table: &str) -> String {
    side_table(table, "_holds")
}

/// The key names beside Spring's `INT_LOCK` (`<table>_NAMES`): Spring stores only an MD5
/// UUID of the key, so `list` finds the key there.
pub(crate) fn names_table(table: &str) -> String {
    side_table(table, "_NAMES")
}

/// The descriptions of distlock's holders beside Spring's `INT_LOCK` (`<table>_OWNERS`): one
/// row per key, naming the `CLIENT_ID` it describes, so that Spring's table stays as Spring
/// made it.
pub(crate) fn owners_table(table: &str) -> String {
    side_table(table, "_OWNERS")
}

/// The waiting writers and mutex waiters of PostgreSQL beside `table` (`<table>_waits`), in
/// the order they came (see `dialect::pg_wait`).
pub(crate) fn waits_table(table: &str) -> String {
    side_table(table, "_waits")
}

fn side_table(table: &str, suffix: &str) -> String {
    if table.len() + suffix.len() <= 63 {
        return format!("{table}{suffix}");
    }
    use md5::{Digest, Md5};
    let d = Md5::digest(table.as_bytes());
    let keep = 63 - suffix.len() - 9;
    format!(
        "{}_{:02x}{:02x}{:02x}{:02x}{suffix}",
        &table[..keep],
        d[0],
        d[1],
        d[2],
        d[3]
    )
}

/// Joins the descriptions of the shared holds in one column: a control character, which no
/// [`Owner`](crate::Owner) holds.
pub(crate) const OWNER_SEP: char = '\u{1f}';

/// The most shared holds whose descriptions an inspection reads, so that a key with a crowd
/// of readers costs a bounded reply.
pub(crate) const MAX_SHARE_OWNERS: usize = 1000;

/// Splits [`HeldRow::share_owners`] into descriptions fit to show.
fn split_owners(joined: Option<&[u8]>) -> Vec<String> {
    match joined {
        None => Vec::new(),
        Some(b) => b
            .split(|c| *c == OWNER_SEP as u8)
            .map(Owner::shown)
            .collect(),
    }
}

/// How a hold of `kind` is kept: exclusive in the key's row, or shared in the holds table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// In the key's row (mutex and writer).
    Row,
    /// In the holds table, with the row marked shared.
    Shared(Share),
}

/// A shared hold: its kind in the holds table, the row's mark and the permits (0 for readers).
///
/// `pub` in this crate-private module because the lease table's engine trait names it; a
/// build with SQLite alone has no lease table, so nothing public reaches it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unreachable_pub)
)]
pub struct Share {
    pub(crate) code: &'static str,
    pub(crate) mark: &'static str,
    pub(crate) permits: i32,
}

impl Share {
    pub(crate) fn is_read(self) -> bool {
        self.code == READ
    }
}

/// Where holds of `name`'s kind live.
pub(crate) fn place(name: &LockName) -> Place {
    match name.kind() {
        LockKind::Read => Place::Shared(Share {
            code: READ,
            mark: READ_MARK,
            permits: 0,
        }),
        LockKind::Semaphore { permits } => Place::Shared(Share {
            code: PERMIT,
            mark: SEM_MARK,
            permits: i32::try_from(permits).unwrap_or(i32::MAX),
        }),
        _ => Place::Row,
    }
}

/// The owner of a shared hold: a permit's token in hex; a reader's id, [`LONE_READER`] and
/// the token in base32 (28 characters: it fits MySQL's 32-character token column and tells
/// itself from a hex token and from the share marks), the same in the key's row and in the
/// holds table.
pub(crate) fn share_owner(name: &LockName, token: Token) -> String {
    if name.kind() != LockKind::Read {
        return token.to_string();
    }
    const DIGITS: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let v = token.as_u128();
    let mut id = String::with_capacity(LONE_READER.len() + 26);
    id.push_str(LONE_READER);
    // 26 digits of 5 bits, the first one taking the top 3.
    for i in (0..26).rev() {
        id.push(char::from(DIGITS[((v >> (5 * i)) & 31) as usize]));
    }
    id
}

/// Whether a key row's `token` is a lone reader's id.
pub(crate) fn is_lone_reader(token: &str) -> bool {
    token.starts_with(LONE_READER)
}

/// The owner column's value for an exclusive hold of `name` (native layouts): the token's
/// hex, upper case for a writer so that the row tells a writer from a mutex holder.
pub(crate) fn row_owner(name: &LockName, token: Token) -> String {
    let hex = token.to_string();
    if name.kind() == LockKind::Write {
        hex.to_ascii_uppercase()
    } else {
        hex
    }
}

/// The error of a semaphore attempt whose holders use `theirs` permits.
pub(crate) fn disagreement(name: &LockName, theirs: i64) -> Error {
    let ours = match name.kind() {
        LockKind::Semaphore { permits } => permits,
        _ => 0,
    };
    Error::config(format!(
        "semaphore {} has holders with {theirs} permits; this one asks for {ours} permits",
        crate::ShortKey(name.key())
    ))
}

/// A held key's row as the inspect and list statements read it: the row's owner, fence and
/// remaining lease, and what the holds table says about shares and waiting writers.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldRow {
    pub(crate) token: String,
    pub(crate) fence: i64,
    pub(crate) remaining_ms: i64,
    /// Live shared holds.
    pub(crate) shares: i64,
    /// The permits of the live semaphore holds.
    pub(crate) permits: Option<i64>,
    /// The longest remaining lease among the live shared holds.
    pub(crate) share_remaining_ms: Option<i64>,
    /// Live waiting writers.
    pub(crate) writers: i64,
    /// The exclusive holder's (or lone reader's) description, `None` where the row has none
    /// (written by a foreign client or an older distlock).
    pub(crate) owner: Option<Vec<u8>>,
    /// The live shared holds' descriptions, joined by [`OWNER_SEP`] (at most
    /// [`MAX_SHARE_OWNERS`]); an empty one for a hold without a description.
    pub(crate) share_owners: Option<Vec<u8>>,
}

impl HeldRow {
    /// What the row says, or `None` when a share mark is left with no live share (free).
    pub(crate) fn info(&self, backend: &'static str) -> Result<Option<LockInfo>> {
        let fence = fence_from(backend, self.fence)?;
        let kind = match self.token.as_str() {
            READ_MARK => Some(LockKind::Read),
            t if is_lone_reader(t) => {
                return Ok(Some(
                    LockInfo::new(Some(fence), Some(millis(self.remaining_ms)))
                        .with_kind(LockKind::Read)
                        .with_holders(1)
                        .with_waiters(u32::try_from(self.writers).unwrap_or(u32::MAX))
                        .with_owners([self.row_owner()]),
                ));
            }
            SEM_MARK => Some(LockKind::Semaphore {
                permits: self
                    .permits
                    .and_then(|p| u32::try_from(p).ok())
                    .unwrap_or(0),
            }),
            _ => None,
        };
        let Some(kind) = kind else {
            // An exclusive holder: ours (hex, upper case for a writer) or a foreign client.
            let writer = self.token.len() == 32
                && self.token.bytes().all(|b| b.is_ascii_hexdigit())
                && self.token.bytes().any(|b| b.is_ascii_uppercase());
            let kind = if writer {
                LockKind::Write
            } else {
                LockKind::Mutex
            };
            return Ok(Some(
                LockInfo::new(Some(fence), Some(millis(self.remaining_ms)))
                    .with_kind(kind)
                    .with_holders(1)
                    .with_owners([self.row_owner()]),
            ));
        };
        if self.shares <= 0 {
            return Ok(None);
        }
        let remaining = self.share_remaining_ms.unwrap_or(self.remaining_ms);
        Ok(Some(
            LockInfo::new(Some(fence), Some(millis(remaining)))
                .with_kind(kind)
                .with_holders(u32::try_from(self.shares).unwrap_or(u32::MAX))
                .with_waiters(u32::try_from(self.writers).unwrap_or(u32::MAX))
                .with_owners(split_owners(self.share_owners.as_deref())),
        ))
    }

    fn row_owner(&self) -> String {
        Owner::shown(self.owner.as_deref().unwrap_or_default())
    }
}

/// The waiting writers of this backend instance that took a place in the holds table (only
/// when they found readers in): their next successful attempt, or their `leave_queue`, gives
/// the place back. Everybody else's `leave_queue` costs nothing. Bounded: past the bound the
/// places are forgotten here and expire on the server after [`WRITER_PLACE_MS`].
#[derive(Debug, Default)]
pub(crate) struct WriterPlaces(Mutex<HashSet<Token>>);

const MAX_WRITER_PLACES: usize = 10_000;

impl WriterPlaces {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<Token>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `token` took (or renewed) its place.
    pub(crate) fn taken(&self, token: Token) {
        let mut set = self.set();
        if set.len() >= MAX_WRITER_PLACES {
            set.clear();
        }
        set.insert(token);
    }

    /// Whether `token` has a place to give back; forgets it.
    pub(crate) fn take(&self, token: Token) -> bool {
        self.set().remove(&token)
    }

    /// Whether `token` has a place.
    pub(crate) fn has(&self, token: Token) -> bool {
        self.set().contains(&token)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::UNKNOWN_OWNER;

    #[test]
    fn side_tables_fit_the_servers_names() {
        assert_eq!(holds_table("distlock_locks"), "distlock_locks_holds");
        assert_eq!(names_table("INT_LOCK"), "INT_LOCK_NAMES");
        let long = "t".repeat(63);
        let h = holds_table(&long);
        assert_eq!(h.len(), 63);
        assert!(h.ends_with("_holds"));
        assert_ne!(h, holds_table(&format!("{}u", "t".repeat(62))));
    }

    #[test]
    fn rows_tell_the_kind_that_holds_them() {
        let row = |token: &str, shares| HeldRow {
            token: token.into(),
            fence: 7,
            remaining_ms: 1000,
            shares,
            permits: Some(3),
            share_remaining_ms: Some(500),
            writers: 1,
            ..HeldRow::default()
        };
        let t = Token::random();
        let mutex = row(&t.to_string(), 0).info("x").unwrap().unwrap();
        assert_eq!(mutex.kind, Some(LockKind::Mutex));
        let name = LockName::new("p", "k").unwrap().with_kind(LockKind::Write);
        let writer = row(&row_owner(&name, t), 0).info("x").unwrap().unwrap();
        assert_eq!(writer.kind, Some(LockKind::Write));
        let read = row(READ_MARK, 2).info("x").unwrap().unwrap();
        assert_eq!(
            (read.kind, read.holders, read.waiters),
            (Some(LockKind::Read), Some(2), Some(1))
        );
        assert_eq!(read.remaining, Some(Duration::from_millis(500)));
        let sem = row(SEM_MARK, 1).info("x").unwrap().unwrap();
        assert_eq!(sem.kind, Some(LockKind::Semaphore { permits: 3 }));
        assert!(
            row(READ_MARK, 0).info("x").unwrap().is_none(),
            "no share left"
        );
    }

    #[test]
    fn rows_tell_their_owners() {
        let t = Token::random();
        let mut held = HeldRow {
            token: t.to_string(),
            owner: Some(b"web-1:42".to_vec()),
            ..HeldRow::default()
        };
        assert_eq!(held.info("x").unwrap().unwrap().owners, ["web-1:42"]);
        // Written by a foreign client or an older distlock: nothing recorded.
        held.owner = None;
        assert_eq!(held.info("x").unwrap().unwrap().owners, [UNKNOWN_OWNER]);
        let shared = HeldRow {
            token: READ_MARK.into(),
            shares: 3,
            share_owners: Some(b"b:2\x1f\x1fa:1\x07".to_vec()),
            ..HeldRow::default()
        };
        assert_eq!(
            shared.info("x").unwrap().unwrap().owners,
            ["a:1", "b:2", UNKNOWN_OWNER]
        );
    }
}

/// Checks of the shared statements that every SQL backend's tests run, given a way to count
/// the rows of its holds table.
#[cfg(test)]
pub(crate) mod checks {
    use std::time::Duration;

    use super::WRITER_PLACE_MS;
    use crate::backend::{
        AcquireMode, AcquireRequest, Attempt, Backend, LockKind, LockName, Token,
    };
    use crate::error::{Error, Result};

    /// Counts rows of the holds table: all of them, or the waiting writers' places.
    pub(crate) type Count<'a> = &'a (dyn Fn(bool) -> usize + Sync);

    fn name(key: &str, kind: LockKind) -> LockName {
        LockName::new("kinds", key).unwrap().with_kind(kind)
    }

    async fn take(
        b: &dyn Backend,
        n: &LockName,
        t: Token,
        lease_ms: u64,
        queued: bool,
    ) -> Result<Attempt> {
        let mode = if queued {
            AcquireMode::Queue
        } else {
            AcquireMode::Try
        };
        let request = AcquireRequest::new(n.clone(), t, Duration::from_millis(lease_ms));
        b.acquire(&request.with_mode(mode)).await
    }

    fn taken(a: Result<Attempt>, what: &str) -> u64 {
        match a {
            Ok(Attempt::Acquired { fence }) => fence,
            other => panic!("{what}: expected Acquired, got {other:?}"),
        }
    }

    fn busy(a: Result<Attempt>, what: &str) {
        assert!(
            matches!(a, Ok(Attempt::Busy { .. })),
            "{what}: expected Busy, got {a:?}"
        );
    }

    /// A reader that stops renewing loses its share after its own lease while another reader
    /// holds on; the next share operation removes its hold, and the key's row is free once the
    /// live reader leaves.
    pub(crate) async fn a_crashed_share_ends_with_its_lease(b: &dyn Backend, count: Count<'_>) {
        let read = name("crash", LockKind::Read);
        let mutex = name("crash", LockKind::Mutex);
        let (crashed, live) = (Token::random(), Token::random());
        let first = taken(take(b, &read, crashed, 300, false).await, "first reader");
        let second = taken(take(b, &read, live, 30_000, false).await, "second reader");
        assert!(second > first, "one fence counter for the key");
        busy(
            take(b, &mutex, Token::random(), 30_000, false).await,
            "mutex beside readers",
        );
        let info = b.inspect(&mutex).await.unwrap().expect("held");
        assert_eq!((info.kind, info.holders), (Some(LockKind::Read), Some(2)));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let info = b
            .inspect(&read)
            .await
            .unwrap()
            .expect("still held by the live reader");
        assert_eq!(
            info.holders,
            Some(1),
            "the crashed share outlived its lease"
        );
        assert!(
            info.remaining.unwrap() > Duration::from_secs(20),
            "{info:?}"
        );
        busy(
            take(b, &mutex, Token::random(), 30_000, false).await,
            "mutex beside a live reader",
        );
        assert!(b
            .extend(&read, live, Duration::from_secs(30))
            .await
            .unwrap());
        assert!(!b
            .extend(&read, crashed, Duration::from_secs(30))
            .await
            .unwrap());
        assert_eq!(count(false), 2);
        assert!(b.release(&read, live).await.unwrap().was_held);
        assert_eq!(
            b.inspect(&read).await.unwrap(),
            None,
            "the row stayed taken"
        );
        assert_eq!(count(false), 0, "the crashed share's hold was left behind");
        assert!(
            !b.release(&read, crashed).await.unwrap().was_held,
            "an expired share released"
        );
        let fence = taken(
            take(b, &mutex, Token::random(), 30_000, false).await,
            "mutex",
        );
        assert!(fence > second);
    }

    /// A lone reader (in the key's row where `lone_in_row`) is joined by a second one, leaves
    /// first, and the owner checks hold all along; then the key goes back to a lone reader and
    /// to a mutex, with fences increasing.
    pub(crate) async fn a_lone_reader_is_joined_and_leaves_first(
        b: &dyn Backend,
        count: Count<'_>,
        lone_in_row: bool,
    ) {
        let read = name("lone", LockKind::Read);
        let mutex = name("lone", LockKind::Mutex);
        let lone_holds = usize::from(!lone_in_row);
        // The key's first use makes its row.
        let m = Token::random();
        taken(take(b, &mutex, m, 30_000, false).await, "first use");
        assert!(b.release(&mutex, m).await.unwrap().was_held);
        let (r1, r2, stranger) = (Token::random(), Token::random(), Token::random());
        let f1 = taken(take(b, &read, r1, 30_000, false).await, "lone reader");
        assert_eq!(count(false), lone_holds, "where the lone reader is kept");
        let info = b.inspect(&read).await.unwrap().expect("held");
        assert_eq!((info.kind, info.holders), (Some(LockKind::Read), Some(1)));
        assert!(!b.release(&read, stranger).await.unwrap().was_held);
        assert!(!b
            .extend(&read, stranger, Duration::from_secs(30))
            .await
            .unwrap());
        assert!(
            !b.release(&mutex, r1).await.unwrap().was_held,
            "a mutex release"
        );
        assert!(b.extend(&read, r1, Duration::from_secs(30)).await.unwrap());
        busy(
            take(b, &mutex, Token::random(), 30_000, false).await,
            "mutex beside a lone reader",
        );
        // A repeated attempt (its reply was lost) is the same hold.
        let again = taken(take(b, &read, r1, 30_000, false).await, "repeated attempt");
        assert!(again > f1);
        let f2 = taken(take(b, &read, r2, 30_000, false).await, "second reader");
        assert!(f2 > again, "one fence counter for the key");
        assert_eq!(count(false), 2, "both readers in the holds table");
        let info = b.inspect(&read).await.unwrap().expect("held");
        assert_eq!((info.kind, info.holders), (Some(LockKind::Read), Some(2)));
        assert!(b.extend(&read, r1, Duration::from_secs(30)).await.unwrap());
        assert!(b.release(&read, r1).await.unwrap().was_held);
        assert!(
            !b.release(&read, r1).await.unwrap().was_held,
            "released twice"
        );
        assert!(!b.extend(&read, r1, Duration::from_secs(30)).await.unwrap());
        busy(
            take(b, &mutex, Token::random(), 30_000, false).await,
            "mutex beside the second reader",
        );
        assert!(b.release(&read, r2).await.unwrap().was_held);
        assert_eq!(b.inspect(&read).await.unwrap(), None);
        assert_eq!(count(false), 0);
        let r3 = Token::random();
        let f3 = taken(take(b, &read, r3, 30_000, false).await, "lone again");
        assert!(f3 > f2);
        assert_eq!(count(false), lone_holds);
        assert!(b.release(&read, r3).await.unwrap().was_held);
        let f4 = taken(take(b, &mutex, m, 30_000, false).await, "mutex");
        assert!(f4 > f3);
        assert!(b.release(&mutex, m).await.unwrap().was_held);
    }

    /// Permit holders must agree on the number of permits; the semaphore admits that many, and
    /// keeps readers out.
    pub(crate) async fn permits_must_agree(b: &dyn Backend) {
        let two = name("sem", LockKind::Semaphore { permits: 2 });
        let three = name("sem", LockKind::Semaphore { permits: 3 });
        let (p1, p2) = (Token::random(), Token::random());
        taken(take(b, &two, p1, 30_000, false).await, "first permit");
        match take(b, &three, Token::random(), 30_000, false).await {
            Err(Error::InvalidConfig(m)) => assert!(m.contains("permit") && m.contains('2'), "{m}"),
            other => panic!("a holder with other permits got {other:?}"),
        }
        taken(take(b, &two, p2, 30_000, true).await, "second permit");
        // A repeated attempt of a holder (its reply was lost) is the same hold.
        taken(take(b, &two, p2, 30_000, false).await, "repeated attempt");
        busy(
            take(b, &two, Token::random(), 30_000, true).await,
            "third permit",
        );
        busy(
            take(
                b,
                &name("sem", LockKind::Read),
                Token::random(),
                30_000,
                false,
            )
            .await,
            "reader beside permits",
        );
        let info = b.inspect(&two).await.unwrap().expect("held");
        assert_eq!(
            (info.kind, info.holders),
            (Some(LockKind::Semaphore { permits: 2 }), Some(2))
        );
        assert!(b.release(&two, p1).await.unwrap().was_held);
        taken(
            take(b, &two, Token::random(), 30_000, false).await,
            "a permit given back",
        );
        assert!(b.force_release(&two).await.unwrap());
        assert!(
            !b.release(&two, p2).await.unwrap().was_held,
            "force release left a permit"
        );
        assert_eq!(b.inspect(&two).await.unwrap(), None);
    }

    /// A waiting writer that finds readers in keeps new readers out until it gives its place
    /// back, its place expires, or it acquires; a writer's hold is in the key's row.
    pub(crate) async fn a_waiting_writer_keeps_readers_out(b: &dyn Backend, count: Count<'_>) {
        let read = name("wp", LockKind::Read);
        let write = name("wp", LockKind::Write);
        let (r1, w) = (Token::random(), Token::random());
        taken(take(b, &read, r1, 30_000, false).await, "reader");
        busy(
            take(b, &write, w, 30_000, false).await,
            "writer, not waiting",
        );
        assert_eq!(count(true), 0, "a writer that does not wait took a place");
        busy(take(b, &write, w, 30_000, true).await, "waiting writer");
        assert_eq!(count(true), 1, "the waiting writer took no place");
        busy(
            take(b, &read, Token::random(), 30_000, false).await,
            "reader behind a writer",
        );
        assert_eq!(b.inspect(&read).await.unwrap().unwrap().waiters, Some(1));
        b.leave_queue(&write, w).await.unwrap();
        assert_eq!(count(true), 0, "leave_queue kept the place");
        let r2 = Token::random();
        taken(
            take(b, &read, r2, 30_000, false).await,
            "reader after the writer left",
        );
        // A place nobody renews ends after a while.
        busy(
            take(b, &write, w, 30_000, true).await,
            "waiting writer again",
        );
        tokio::time::sleep(Duration::from_millis(WRITER_PLACE_MS as u64 + 300)).await;
        let r3 = Token::random();
        taken(
            take(b, &read, r3, 30_000, false).await,
            "reader after the place expired",
        );
        busy(
            take(b, &write, w, 30_000, true).await,
            "waiting writer, third time",
        );
        for r in [r1, r2, r3] {
            assert!(b.release(&read, r).await.unwrap().was_held);
        }
        taken(
            take(b, &write, w, 30_000, true).await,
            "writer once the readers left",
        );
        assert_eq!(count(true), 0, "the writer's acquisition kept its place");
        let info = b.inspect(&read).await.unwrap().expect("held");
        assert_eq!((info.kind, info.holders), (Some(LockKind::Write), Some(1)));
        busy(
            take(b, &read, Token::random(), 30_000, false).await,
            "reader beside the writer",
        );
        busy(
            take(
                b,
                &name("wp", LockKind::Mutex),
                Token::random(),
                30_000,
                true,
            )
            .await,
            "mutex beside the writer",
        );
        assert!(b.extend(&write, w, Duration::from_secs(30)).await.unwrap());
        assert!(b.release(&write, w).await.unwrap().was_held);
        let listed = b.list("kinds").await.unwrap();
        assert!(listed.is_empty(), "{listed:?}");
    }
}
