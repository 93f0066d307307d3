//! Release notifications for MySQL/MariaDB, which have no `NOTIFY`: a "doorbell" per lock made
//! of a named user lock (`GET_LOCK`).
//!
//! - The **holder's** backend takes the lock's doorbell (`GET_LOCK(name, 0)`) on a dedicated
//!   connection of its own while it holds a lock that others want, and gives it back
//!   (`RELEASE_LOCK`) in the same round trip as the release, on that connection. A lock seen
//!   contended lately (busy, or marked wanted by a waiter) is taken on that connection too,
//!   with the doorbell in the same round trip; otherwise the acquisition runs on the pool and
//!   the doorbell is taken afterwards, only if a waiter marked the row wanted. Uncontended
//!   locks cost no doorbell statement at all.
//! - A **waiter's** backend has one listener connection per waited-for lock. The listeners of
//!   all processes first queue for the lock's *turnstile* (`GET_LOCK` on a second name), which
//!   the server grants in arrival order; only the listener holding it runs the dialect's
//!   `doorbell_wait` statement, which returns at once when the lock is free, and otherwise waits
//!   in `GET_LOCK(doorbell)` until the holder gives the doorbell back (or its connection dies),
//!   giving it back in the same statement. A release therefore wakes one process, the next in
//!   line, within a round trip, rather than every waiter at once (each of which would cost a
//!   statement and an attempt). The turnstile is given back as soon as its process took the
//!   lock or stopped waiting; a process that waits again queues behind the others, which makes
//!   the handoff between processes first come, first served.
//!
//! The doorbell only says *when to look*; the lease table alone decides who holds the lock. A
//! doorbell that is missing (the holder did not know it was wanted, its holder is another
//! client such as Spring's `JdbcLockRegistry`, its connection was replaced) or rings early
//! only costs a wasted attempt: the waiter then looks at the row, briefly while the lock is
//! changing hands and backing off to every few milliseconds while it is not, and the
//! registry's polling (which also notices expired leases) stays the fallback.
//!
//! Session-scoped `GET_LOCK`s are taken only on these dedicated connections, never on the
//! pooled ones, so nothing leaks to the next borrower of a pooled connection.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row};
use tokio::sync::{mpsc, oneshot, Notify};

use super::dialect::MyOutcome;
use crate::backend::ReleaseSignals;

/// How long one waiter's `GET_LOCK` waits (seconds) before it checks whether anybody still
/// listens (a turnstile held by a listener whose waiter gave up waits that long at most).
pub(crate) const LISTEN_WAIT_S: f64 = 0.5;
/// How long a listener stays in line for the turnstile. Giving up and queueing again would
/// lose its place, so this is long: a listener whose waiters went away meanwhile passes the
/// turnstile on as soon as it gets it.
const TURNSTILE_WAIT_S: f64 = 30.0;
/// How long an idle listener keeps its connection for the next wait.
const IDLE_KEEP: Duration = Duration::from_secs(2);
/// When to try again to take a doorbell that a waiter was just giving back.
const ARM_RETRY: Duration = Duration::from_millis(1);
/// Most waiter connections per backend; more waited-for locks fall back to polling.
const MAX_LISTENERS: usize = 32;
/// Doorbell statements per batch of the holder's connection.
const BATCH: usize = 256;
/// How long a lock counts as contended after it was last seen busy or waited for.
const CONTENDED_FOR: Duration = Duration::from_secs(2);
/// Most locks remembered as contended.
const MAX_CONTENDED: usize = 10_000;
/// How often the holder's connection is checked while it holds doorbells.
const PING: Duration = Duration::from_secs(1);
/// Pauses between two looks at a lock whose holder does not hold the doorbell (yet): from the
/// time a holder takes to ring after its acquisition up to a polling interval that costs little.
const MIN_BACKOFF: Duration = Duration::from_micros(100);
const MAX_BACKOFF: Duration = Duration::from_millis(8);
/// How long a waiter behind another process in the turnstile's line leaves a free lock to the
/// processes ahead of it (milliseconds): the one at the head is being woken and takes it well
/// within this; one that does not come (paused, or gone without its connection closing yet)
/// holds the others up this long at most.
pub(crate) const HEAD_GRACE_MS: i64 = 1000;
/// After a ring the woken waiters race for the lock; until one of them commits, the row reads
/// free, which is no reason to wake them again.
const RING_SETTLE: Duration = Duration::from_millis(5);

/// The doorbell of a lock: at most 64 characters (MySQL's limit) of `[0-9a-z-]`, unique per
/// table (qualified by its database: user lock names are global to the server), region and
/// key.
pub(crate) fn doorbell_name(table: &str, region: &str, key: &str) -> String {
    use md5::{Digest, Md5};
    let mut h = Md5::new();
    for part in [table, region, key] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    let mut s = String::from("distlock-");
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// What a MySQL query returned: the matched rows and the `LAST_INSERT_ID(expr)` value of its
/// first statement (and of each statement, in `statements`), and the rows of its last result
/// set that had any.
pub(crate) struct Outcome {
    pub(crate) affected: u64,
    pub(crate) last_insert_id: Option<u64>,
    pub(crate) rows: Vec<Row>,
    pub(crate) statements: Vec<(u64, Option<u64>)>,
}

/// What a statement run on a holder's connection does with the lock's doorbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ring {
    /// The statement is a single-statement acquisition (`LAST_INSERT_ID` below the busy mark
    /// means taken): take the doorbell in the same round trip if it was.
    ArmIfAcquired,
    /// The statement is a release: give the doorbell back in the same round trip.
    Disarm,
}

type Reply = oneshot::Sender<std::result::Result<Outcome, mysql_async::Error>>;

/// The turnstile of a lock (see [`listener`]), named after its doorbell.
fn turnstile_name(doorbell: &str) -> String {
    doorbell.replacen("distlock-", "distlockq-", 1)
}

enum Command {
    Arm(String),
    Exec {
        doorbell: String,
        sql: String,
        ring: Ring,
        reply: Reply,
    },
}

/// What a backend tells the listener of a doorbell.
#[derive(Default)]
struct Listening {
    /// Somebody waits (again), or `acquired` was set.
    wake: Notify,
    /// This backend took the lock: the listener gives the turnstile back at once, so the next
    /// process in line watches the doorbell (and this one queues again behind it).
    acquired: AtomicBool,
    /// The listener is in line for the turnstile behind another process's listener.
    behind: AtomicBool,
}

/// One holder's connection: its command queue and its connection id (0 while disconnected).
struct Ringer {
    commands: mpsc::UnboundedSender<Command>,
    id: Arc<AtomicU32>,
}

/// The doorbells of one backend instance.
pub(crate) struct Doorbells {
    opts: Opts,
    /// The holder's connections; a lock always uses the same one (by its doorbell's name), so
    /// that its doorbell is taken and given back on one session, in order.
    ringers: Vec<Ringer>,
    /// Doorbells with a waiter connection on them, and how to tell an idle one that somebody
    /// waits again.
    listening: Mutex<HashMap<String, Arc<Listening>>>,
    /// Doorbells taken (or being taken) for this backend's holds.
    armed: Mutex<HashSet<String>>,
    /// When this backend last saw each lock contended (busy, or waited for).
    contended: Mutex<HashMap<String, Instant>>,
}

impl Doorbells {
    /// Starts `n` holder's connection tasks (each connects on first use). Every connection
    /// attempt and statement of theirs is limited to `limit`; a connection that did not
    /// answer in time is closed and replaced.
    pub(crate) fn new(opts: Opts, n: usize, limit: Duration) -> Arc<Self> {
        let ringers = (0..n.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                let id = Arc::new(AtomicU32::new(0));
                tokio::spawn(ringer(opts.clone(), rx, id.clone(), limit));
                Ringer { commands: tx, id }
            })
            .collect();
        Arc::new(Doorbells {
            opts,
            ringers,
            listening: Mutex::new(HashMap::new()),
            armed: Mutex::new(HashSet::new()),
            contended: Mutex::new(HashMap::new()),
        })
    }

    fn ringer(&self, doorbell: &str) -> &Ringer {
        let h = doorbell.bytes().fold(0usize, |h, b| {
            h.wrapping_mul(31).wrapping_add(usize::from(b))
        });
        &self.ringers[h % self.ringers.len()]
    }

    /// Whether a connection id is one of this backend's holder's connections.
    fn is_ours(&self, id: u64) -> bool {
        id != 0
            && self
                .ringers
                .iter()
                .any(|r| u64::from(r.id.load(Ordering::Acquire)) == id)
    }

    /// Notes that the lock of `doorbell` was busy or waited for.
    pub(crate) fn note_contended(&self, doorbell: &str) {
        let mut c = self.contended.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() >= MAX_CONTENDED {
            c.retain(|_, t| t.elapsed() < CONTENDED_FOR);
            if c.len() >= MAX_CONTENDED {
                c.clear();
            }
        }
        c.insert(doorbell.to_owned(), Instant::now());
    }

    /// Whether the lock of `doorbell` was contended lately: then an acquisition takes the
    /// doorbell in the same round trip, on the holder's connection, instead of afterwards.
    pub(crate) fn recently_contended(&self, doorbell: &str) -> bool {
        let c = self.contended.lock().unwrap_or_else(|e| e.into_inner());
        c.get(doorbell).is_some_and(|t| t.elapsed() < CONTENDED_FOR)
    }

    fn armed(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.armed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this backend holds (or is taking) `doorbell`.
    pub(crate) fn is_armed(&self, doorbell: &str) -> bool {
        self.armed().contains(doorbell)
    }

    /// Holds `doorbell` while the lock is ours (after the acquisition committed), in the
    /// background.
    pub(crate) fn arm(&self, doorbell: String) {
        let mut armed = self.armed();
        armed.insert(doorbell.clone());
        // Sent under the mutex, so that commands for one doorbell stay in order.
        let _ = self.ringer(&doorbell).commands.send(Command::Arm(doorbell));
    }

    /// Runs `sql` on the holder's connection of `doorbell`, with the doorbell taken or given
    /// back in the same round trip (see [`Ring`]). The statement runs to its end even if the
    /// caller stops waiting.
    pub(crate) async fn exec(
        &self,
        doorbell: &str,
        sql: String,
        ring: Ring,
    ) -> std::result::Result<Outcome, mysql_async::Error> {
        let (reply, answer) = oneshot::channel();
        {
            let mut armed = self.armed();
            match ring {
                Ring::ArmIfAcquired => armed.insert(doorbell.to_owned()),
                Ring::Disarm => armed.remove(doorbell),
            };
            let sent = self.ringer(doorbell).commands.send(Command::Exec {
                doorbell: doorbell.to_owned(),
                sql,
                ring,
                reply,
            });
            if sent.is_err() {
                return Err(gone());
            }
        }
        let out = answer.await.unwrap_or_else(|_| Err(gone()));
        if ring == Ring::ArmIfAcquired {
            let taken = matches!(&out, Ok(e) if acquired(e));
            if !taken {
                self.armed().remove(doorbell);
            }
        }
        out
    }

    /// Makes sure a waiter connection listens on `doorbell` and fires `channel` of `signals`
    /// when it rings, for as long as `channel` has subscribers.
    pub(crate) fn listen(
        self: &Arc<Self>,
        doorbell: String,
        channel: String,
        sql: String,
        signals: &Arc<ReleaseSignals>,
    ) {
        let mut listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = listening.get(&doorbell) {
            l.wake.notify_one();
            return;
        }
        if listening.len() >= MAX_LISTENERS {
            return;
        }
        let wake = Arc::new(Listening::default());
        listening.insert(doorbell.clone(), wake.clone());
        tokio::spawn(listener(
            Arc::downgrade(self),
            doorbell,
            channel,
            sql,
            Arc::downgrade(signals),
            wake,
        ));
    }

    /// Ends an idle listener unless somebody waits again; decided under the same mutex as
    /// [`listen`](Self::listen) starts one, so a new waiter never finds a listener that is
    /// about to stop.
    fn stop_listening(&self, doorbell: &str, channel: &str, signals: &ReleaseSignals) -> bool {
        let mut listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        if signals.has_subscribers(channel) {
            return false;
        }
        listening.remove(doorbell);
        true
    }

    /// This backend took the lock of `doorbell` (see [`Listening::acquired`]).
    pub(crate) fn acquired(&self, doorbell: &str) {
        let listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = listening.get(doorbell) {
            l.acquired.store(true, Ordering::Release);
            l.wake.notify_one();
        }
    }

    /// Whether this backend's waiters of `doorbell` are in line behind another process's,
    /// which a free lock is left to for [`HEAD_GRACE_MS`].
    pub(crate) fn behind(&self, doorbell: &str) -> bool {
        let listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        listening
            .get(doorbell)
            .is_some_and(|l| l.behind.load(Ordering::Acquire))
    }

    /// The ids of this backend's doorbell connections, as an SQL list.
    fn own_ringers(&self) -> String {
        let ids: Vec<String> = self
            .ringers
            .iter()
            .map(|r| r.id.load(Ordering::Acquire).to_string())
            .collect();
        ids.join(", ")
    }
}

fn gone() -> mysql_async::Error {
    mysql_async::Error::Io(mysql_async::IoError::Io(std::io::Error::other(
        "the doorbell connection task is gone",
    )))
}

/// Whether a single-statement acquisition took the lock.
fn acquired(e: &Outcome) -> bool {
    e.affected > 0
        && matches!(
            e.last_insert_id.and_then(MyOutcome::decode),
            Some(MyOutcome::Acquired { .. })
        )
}

/// The holder's connection: runs arm commands in order (batched into one statement when
/// several are queued) and statements that take or give back a doorbell in the same round
/// trip, and takes every
/// armed doorbell again after a reconnect (a closed connection gave them all back). It never
/// blocks on a doorbell: one that a waiter holds for an instant is tried again after
/// [`ARM_RETRY`]. While it holds doorbells it checks its connection every [`PING`], so that one
/// killed by the server is replaced (and its doorbells taken again) without waiting for the
/// next command.
async fn ringer(
    opts: Opts,
    mut rx: mpsc::UnboundedReceiver<Command>,
    id: Arc<AtomicU32>,
    limit: Duration,
) {
    let mut conn: Option<Conn> = None;
    let mut armed: HashSet<String> = HashSet::new();
    // Armed doorbells whose GET_LOCK found them taken.
    let mut retry: HashSet<String> = HashSet::new();
    let mut queue: std::collections::VecDeque<Command> = std::collections::VecDeque::new();
    // The session must be (re)checked before waiting for the next command.
    let mut check = false;
    loop {
        if queue.is_empty() && !check {
            let wait = if retry.is_empty() { PING } else { ARM_RETRY };
            match tokio::time::timeout(wait, rx.recv()).await {
                Ok(Some(c)) => queue.push_back(c),
                Ok(None) => break,
                Err(_) if armed.is_empty() => continue,
                Err(_) => {}
            }
        }
        check = false;
        while queue.len() < BATCH {
            match rx.try_recv() {
                Ok(c) => queue.push_back(c),
                Err(_) => break,
            }
        }
        if conn.is_none() {
            match bounded(limit, Conn::new(opts.clone())).await {
                Ok(c) => {
                    id.store(c.id(), Ordering::Release);
                    conn = Some(c);
                    // A new session holds nothing: take every armed doorbell again.
                    retry.extend(armed.iter().cloned());
                }
                Err(e) => {
                    // Nobody can be rung meanwhile; waiters poll. Statements fail (their
                    // callers retry); doorbells are taken again once connected.
                    tracing::debug!(error = %e, "doorbell connection failed");
                    for c in queue.drain(..) {
                        match c {
                            Command::Arm(n) => {
                                armed.insert(n);
                            }
                            Command::Exec { reply, .. } => {
                                let _ = reply.send(Err(mysql_async::Error::Io(
                                    mysql_async::IoError::Io(std::io::Error::other(format!(
                                        "no doorbell connection: {e}"
                                    ))),
                                )));
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    check = !armed.is_empty();
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        // Arms up to the next statement, as one batch (with pending retries).
        let mut ops: Vec<String> = retry.drain().filter(|n| armed.contains(n)).collect();
        while let Some(Command::Arm(n)) = queue.front() {
            armed.insert(n.clone());
            ops.push(n.clone());
            queue.pop_front();
        }
        let mut failed = false;
        if !ops.is_empty() || queue.is_empty() {
            let check_only = ["1".to_owned()];
            let chunks: Vec<&[String]> = if ops.is_empty() {
                vec![&check_only[..]] // just check the session
            } else {
                ops.chunks(BATCH).collect()
            };
            for chunk in chunks {
                let exprs: Vec<String> = chunk
                    .iter()
                    .map(|n| {
                        if ops.is_empty() {
                            n.clone()
                        } else {
                            arm_expr(n)
                        }
                    })
                    .collect();
                let sql = format!("SELECT {}", exprs.join(", "));
                match bounded(limit, c.query_first::<Row, _>(&sql)).await {
                    Ok(row) => {
                        for (i, n) in chunk.iter().enumerate() {
                            if !ops.is_empty() && !took(row.as_ref(), i) && armed.contains(n) {
                                retry.insert(n.clone());
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "doorbell statement failed; reconnecting");
                        failed = true;
                        break;
                    }
                }
            }
        }
        if !failed {
            if let Some(Command::Exec {
                doorbell,
                sql,
                ring,
                reply,
            }) = queue.front()
            {
                let full = match ring {
                    Ring::ArmIfAcquired => format!(
                        "{sql}; SELECT IF(ROW_COUNT() > 0 AND LAST_INSERT_ID() > 0 \
                         AND LAST_INSERT_ID() < {}, {}, NULL)",
                        MyOutcome::BUSY,
                        arm_expr(doorbell)
                    ),
                    Ring::Disarm => format!("{sql}; DO RELEASE_LOCK('{doorbell}')"),
                };
                let (doorbell, ring) = (doorbell.clone(), *ring);
                let _ = reply;
                let out = bounded(limit, async {
                    match c.query_iter(full.as_str()).await {
                        Ok(r) => outcome(r).await,
                        Err(e) => Err(e),
                    }
                })
                .await;
                let Some(Command::Exec { reply, .. }) = queue.pop_front() else {
                    unreachable!("the front command is a statement")
                };
                match &out {
                    Ok(e) => match ring {
                        Ring::ArmIfAcquired if acquired(e) => {
                            armed.insert(doorbell.clone());
                            if !took(e.rows.last(), 0) {
                                retry.insert(doorbell);
                            }
                        }
                        Ring::ArmIfAcquired => {}
                        Ring::Disarm => {
                            armed.remove(&doorbell);
                        }
                    },
                    Err(_) => {
                        if ring == Ring::Disarm {
                            armed.remove(&doorbell);
                        }
                        failed = true;
                    }
                }
                let _ = reply.send(out.map(|mut e| {
                    if ring == Ring::ArmIfAcquired {
                        e.rows.clear(); // the doorbell's own result
                    }
                    e
                }));
            }
        }
        if failed {
            id.store(0, Ordering::Release);
            if let Some(c) = conn.take() {
                super::mysql::discard(c);
            }
            check = true;
        }
    }
    if let Some(c) = conn {
        let _ = c.disconnect().await;
    }
}

/// `fut`, or a timeout error after `limit`.
async fn bounded<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = std::result::Result<T, mysql_async::Error>>,
) -> std::result::Result<T, mysql_async::Error> {
    tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
        Err(mysql_async::Error::Io(mysql_async::IoError::Io(
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no reply within {limit:?}"),
            ),
        )))
    })
}

/// Whether column `i` of a doorbell statement's row says the doorbell was taken.
fn took(row: Option<&Row>, i: usize) -> bool {
    row.and_then(|r| r.get_opt::<Option<i64>, usize>(i))
        .and_then(|v| v.ok())
        .flatten()
        == Some(1)
}

/// Reads a whole result, text or binary protocol, and fails with the first statement that
/// failed: see [`Outcome`].
pub(crate) async fn outcome<P: mysql_async::prelude::Protocol>(
    mut result: mysql_async::QueryResult<'_, '_, P>,
) -> std::result::Result<Outcome, mysql_async::Error> {
    let affected = result.affected_rows();
    let last_insert_id = result.last_insert_id();
    let mut rows = Vec::new();
    let mut statements = Vec::new();
    loop {
        statements.push((result.affected_rows(), result.last_insert_id()));
        let set: Vec<Row> = result.collect().await?;
        if !set.is_empty() {
            rows = set;
        }
        if result.is_empty() {
            break;
        }
    }
    // A statement after the first that failed can leave its error pending behind an empty
    // result (`is_empty` is then true): read it out here, rather than leave it (and, in a
    // transaction, the transaction) to the connection's next query.
    result.drop_result().await?;
    Ok(Outcome {
        affected,
        last_insert_id,
        rows,
        statements,
    })
}

/// Takes a doorbell unless this session already holds it (`GET_LOCK` nests: a second one would
/// need a second `RELEASE_LOCK`); never waits.
fn arm_expr(n: &str) -> String {
    format!("IF(IS_USED_LOCK('{n}') <=> CONNECTION_ID(), 1, GET_LOCK('{n}', 0))")
}

/// One waiter connection on one doorbell. `sql` is the dialect's `doorbell_wait` statement:
/// it returns at once when the lock is free, else waits for the doorbell to be given back.
///
/// The waiters of all processes queue for the lock's *turnstile*, another named lock: only the
/// listener that holds it watches the doorbell and wakes its process, so a release wakes one
/// process (in the order they came, as the server grants named locks) instead of all of them,
/// each of which would take a statement and a round of attempts. The turnstile is given back
/// as soon as nobody in this process waits any more (its waiter took the lock, or gave up).
/// An idle listener keeps its connection for [`IDLE_KEEP`], for the next wait.
async fn listener(
    bells: Weak<Doorbells>,
    doorbell: String,
    channel: String,
    sql: String,
    signals: Weak<ReleaseSignals>,
    wake: Arc<Listening>,
) {
    let turnstile = turnstile_name(&doorbell);
    let mut conn: Option<Conn> = None;
    let mut have_turnstile = false;
    let mut backoff = Duration::ZERO;
    // When the last ring came, and the lock's version right after it.
    let mut last_ring: Option<(Instant, Option<i64>)> = None;
    // The lock's version when this listener last woke the waiters for a free lock.
    let mut last_fire: Option<Option<i64>> = None;
    loop {
        let (Some(b), Some(s)) = (bells.upgrade(), signals.upgrade()) else {
            break;
        };
        let acquired = wake.acquired.swap(false, Ordering::AcqRel);
        if acquired || !s.has_subscribers(&channel) {
            if have_turnstile {
                if let Some(c) = conn.as_mut() {
                    if c.query_drop(format!("DO RELEASE_LOCK('{turnstile}')"))
                        .await
                        .is_err()
                    {
                        conn = None;
                    }
                }
                have_turnstile = false;
            }
            if s.has_subscribers(&channel) {
                continue; // another waiter of this process: queue again
            }
            drop((b, s));
            if tokio::time::timeout(IDLE_KEEP, wake.wake.notified())
                .await
                .is_ok()
            {
                continue;
            }
            let (Some(b), Some(s)) = (bells.upgrade(), signals.upgrade()) else {
                break;
            };
            if b.stop_listening(&doorbell, &channel, &s) {
                break;
            }
            continue;
        }
        if conn.is_none() {
            have_turnstile = false;
            match Conn::new(b.opts.clone()).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "doorbell listener cannot connect; polling");
                    b.listening
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&doorbell);
                    return;
                }
            }
        }
        drop(s);
        let Some(c) = conn.as_mut() else { break };
        if !have_turnstile {
            let wait = TURNSTILE_WAIT_S;
            // Counted as behind while the `GET_LOCK` is on its way: a listener that meets an
            // empty line gets the turnstile at once and then wakes its waiter (the lock is
            // free, or it watches the doorbell), which then no longer defers.
            wake.behind.store(true, Ordering::Release);
            let got = c
                .query_first::<Option<i64>, _>(format!("SELECT GET_LOCK('{turnstile}', {wait})"))
                .await;
            wake.behind
                .store(matches!(got, Ok(Some(Some(0)))), Ordering::Release);
            match got {
                Ok(Some(Some(1))) => have_turnstile = true,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "turnstile wait failed; reconnecting");
                    conn = None;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            continue;
        }
        let started = Instant::now();
        let statement = sql.replace("OWN_RINGERS", &b.own_ringers());
        let row: Option<Row> = match c.query_first(&statement).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "doorbell wait failed; reconnecting");
                conn = None;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let v = |i| {
            row.as_ref()
                .and_then(|r| r.get_opt::<Option<u64>, usize>(i))
                .and_then(|x| x.ok())
                .flatten()
                .unwrap_or(0)
        };
        let (held_by, free, rang) = (v(0), v(1) == 1, v(2) == 1);
        let version = row
            .as_ref()
            .and_then(|r| r.get_opt::<Option<i64>, usize>(3))
            .and_then(|x| x.ok())
            .flatten();
        let own = b.is_ours(held_by);
        drop(b);
        let waited = started.elapsed() >= Duration::from_millis(2);
        let fire = || {
            if let Some(s) = signals.upgrade() {
                s.fire(&channel);
            }
        };
        if rang && own {
            // Our own holder gave the doorbell back: its release woke this process already.
            last_ring = Some((Instant::now(), version));
            backoff = Duration::ZERO;
        } else if rang && (waited || held_by != 0) {
            // A holder gave the doorbell back after its release committed.
            fire();
            last_ring = Some((Instant::now(), version));
            backoff = Duration::ZERO;
        } else if free {
            // Free without a ring: the holder's lease ran out, or it does not ring (Spring's
            // registry), or a ring just woke the waiters, one of which is taking the lock
            // (until it commits, the row still reads free, at the version of the ring). Look,
            // unless it is that last case, and wait a little, so that a lock nobody takes
            // costs no busy loop.
            let settling =
                last_ring.is_some_and(|(t, v)| v == version && t.elapsed() < RING_SETTLE);
            if settling {
                pause(&wake, MIN_BACKOFF).await;
                continue;
            }
            fire();
            // Still the version of the last wake-up: nobody took the lock since, so back off;
            // a new version means the lock is changing hands, and its next holder rings soon.
            backoff = if last_fire == Some(version) {
                next_backoff(backoff)
            } else {
                MIN_BACKOFF
            };
            last_fire = Some(version);
            pause(&wake, backoff).await;
        } else if rang || own {
            // Held but the doorbell was not: its holder has not taken it yet (or does not
            // ring); or held by this process, whose release wakes its waiters directly.
            backoff = next_backoff(backoff);
            pause(&wake, backoff).await;
        }
        // Otherwise the wait timed out: nothing happened.
    }
    if let Some(c) = conn {
        let _ = c.disconnect().await;
    }
}

/// Sleeps for `d`, or less if the backend has news for the listener.
async fn pause(l: &Listening, d: Duration) {
    let _ = tokio::time::timeout(d, l.wake.notified()).await;
}

fn next_backoff(d: Duration) -> Duration {
    (d * 2).clamp(MIN_BACKOFF, MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_names_fit_mysql_and_differ() {
        let a = doorbell_name("distlock_locks", "lock", "k");
        assert!(a.len() <= 64, "{a}");
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        assert_ne!(a, doorbell_name("distlock_locks", "lock", "k2"));
        assert_ne!(a, doorbell_name("distlock_locks", "lockk", ""));
        assert_ne!(a, doorbell_name("other", "lock", "k"));
    }
}
