//! The MySQL backend's statement connections ("sessions"): `pool_size` tasks (one by default),
//! each owning one connection that it opens on first use and keeps for the life of the
//! backend. Every statement of the backend runs on one of them, in order, and so do the
//! doorbells of the locks this backend holds (named user locks, taken and given back on the
//! session that holds them, see the `doorbell` module).
//!
//! Keeping the connection is what lets a release run when the server takes no new
//! connections (`max_connections` reached): a release never needs a connection the backend
//! did not already have, unless the server closed that one. With the waiters' one listener
//! connection a backend needs two connections to the server, whatever the number of keys it
//! holds or waits for.
//!
//! A session never blocks on a doorbell (one that a waiter holds for an instant is tried again
//! after [`ARM_RETRY`]); while it holds doorbells it checks its connection every [`PING`], so
//! that one killed by the server is replaced (and its doorbells taken again) without waiting
//! for the next command. A statement whose caller went away before it started is skipped; one
//! whose caller goes away while it runs is cut off and its connection closed (a stalled
//! server must not hold up the backend's other statements), except a statement that takes or
//! gives back a doorbell, which runs to its end.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row, Value};
use tokio::sync::{mpsc, oneshot};

use super::driver::{classify, discard, Class};
use crate::backends::sql::dialect::MyOutcome;

/// When to try again to take a doorbell that a waiter was just giving back.
const ARM_RETRY: Duration = Duration::from_millis(1);
/// Doorbell statements per batch.
const BATCH: usize = 256;
/// How often the connection is checked while it holds doorbells.
const PING: Duration = Duration::from_secs(1);

/// What a MySQL query returned: the matched rows and the `LAST_INSERT_ID(expr)` value of its
/// first statement (and of each statement, in `statements`), and the rows of its last result
/// set that had any.
pub(crate) struct Outcome {
    pub(crate) affected: u64,
    pub(crate) last_insert_id: Option<u64>,
    pub(crate) rows: Vec<Row>,
    pub(crate) statements: Vec<(u64, Option<u64>)>,
}

/// What a statement run with a lock's doorbell does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ring {
    /// The statement is a single-statement acquisition (`LAST_INSERT_ID` below the busy mark
    /// means taken): take the doorbell in the same round trip if it was.
    ArmIfAcquired,
    /// The statement is a release: give the doorbell back in the same round trip.
    Disarm,
}

/// A statement to run: text (one or more statements), a transaction of several (which
/// closes its connection on any error: statements after a failed one are not run, so the
/// transaction may still be open), or prepared with its values.
pub(crate) enum Job {
    Text(String),
    Transaction(String),
    Prepared(String, Vec<Value>),
}

/// Why a command failed, and whether its statement may have run.
pub(crate) struct Failed {
    pub(crate) error: mysql_async::Error,
    /// False when nothing was sent (no connection could be had): trying again is safe.
    pub(crate) sent: bool,
}

type Reply = oneshot::Sender<std::result::Result<Outcome, Failed>>;

enum Command {
    Arm(String),
    Exec {
        doorbell: String,
        sql: String,
        ring: Ring,
        reply: Reply,
    },
    Run {
        job: Job,
        reply: Reply,
    },
}

/// One session: its command queue and its connection id (0 while disconnected).
pub(crate) struct Session {
    commands: mpsc::UnboundedSender<Command>,
    id: Arc<AtomicU32>,
}

impl Session {
    /// Starts a session task (it connects on first use). Connecting is limited to `connect`,
    /// each statement to `limit`; a connection that did not answer in time is closed and
    /// replaced.
    pub(crate) fn start(opts: Opts, connect: Duration, limit: Duration) -> Session {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = Arc::new(AtomicU32::new(0));
        tokio::spawn(session(opts, rx, id.clone(), connect, limit));
        Session { commands: tx, id }
    }

    /// The connection's id, 0 while disconnected.
    pub(crate) fn id(&self) -> u32 {
        self.id.load(Ordering::Acquire)
    }

    /// Takes `doorbell` (in the background, in order with the session's other commands).
    pub(crate) fn arm(&self, doorbell: String) {
        let _ = self.commands.send(Command::Arm(doorbell));
    }

    /// Sends a statement with a doorbell (see [`Ring`]); the reply comes on `answer`.
    pub(crate) fn exec(&self, doorbell: &str, sql: String, ring: Ring) -> Answer {
        let (reply, answer) = oneshot::channel();
        let sent = self.commands.send(Command::Exec {
            doorbell: doorbell.to_owned(),
            sql,
            ring,
            reply,
        });
        Answer(sent.is_ok().then_some(answer))
    }

    /// Runs `job`.
    pub(crate) async fn run(&self, job: Job) -> std::result::Result<Outcome, Failed> {
        let (reply, answer) = oneshot::channel();
        let sent = self.commands.send(Command::Run { job, reply });
        Answer(sent.is_ok().then_some(answer)).wait().await
    }
}

/// The reply to a command sent to a session.
pub(crate) struct Answer(Option<oneshot::Receiver<std::result::Result<Outcome, Failed>>>);

impl Answer {
    pub(crate) async fn wait(self) -> std::result::Result<Outcome, Failed> {
        match self.0 {
            Some(rx) => rx.await.unwrap_or_else(|_| Err(gone(true))),
            None => Err(gone(false)),
        }
    }
}

fn gone(sent: bool) -> Failed {
    Failed {
        error: io_error("the connection task is gone".to_owned()),
        sent,
    }
}

fn io_error(message: String) -> mysql_async::Error {
    mysql_async::Error::Io(mysql_async::IoError::Io(std::io::Error::other(message)))
}

/// A copy of a connection error for each further command it fails (a server's refusal keeps
/// its code, an I/O error its kind, so that the caller classifies it as it would the
/// original).
fn copy_error(e: &mysql_async::Error) -> mysql_async::Error {
    match e {
        mysql_async::Error::Server(s) => mysql_async::Error::Server(s.clone()),
        mysql_async::Error::Io(mysql_async::IoError::Io(io)) => mysql_async::Error::Io(
            mysql_async::IoError::Io(std::io::Error::new(io.kind(), io.to_string())),
        ),
        other => io_error(format!("no connection: {other}")),
    }
}

/// Whether a single-statement acquisition took the lock.
pub(crate) fn acquired(e: &Outcome) -> bool {
    e.affected > 0
        && matches!(
            e.last_insert_id.and_then(MyOutcome::decode),
            Some(MyOutcome::Acquired { .. })
        )
}

/// The session task: runs commands in order (consecutive doorbell arms as one statement) and
/// statements that take or give back a doorbell in the same round trip, and takes every armed
/// doorbell again after a reconnect (a closed connection gave them all back).
async fn session(
    opts: Opts,
    mut rx: mpsc::UnboundedReceiver<Command>,
    id: Arc<AtomicU32>,
    connect: Duration,
    limit: Duration,
) {
    let mut conn: Option<Conn> = None;
    let mut armed: HashSet<String> = HashSet::new();
    // Armed doorbells whose GET_LOCK found them taken.
    let mut retry: HashSet<String> = HashSet::new();
    let mut queue: VecDeque<Command> = VecDeque::new();
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
            match bounded(connect, Conn::new(opts.clone())).await {
                Ok(c) => {
                    id.store(c.id(), Ordering::Release);
                    conn = Some(c);
                    // A new session holds nothing: take every armed doorbell again.
                    retry.extend(armed.iter().cloned());
                }
                Err(e) => {
                    let e_copy = copy_error(&e);
                    // Statements fail before anything was sent (their callers may retry);
                    // doorbells are taken again once connected, and waiters poll meanwhile.
                    tracing::debug!(error = %e, "session connection failed");
                    let mut original = Some(e);
                    for c in queue.drain(..) {
                        match c {
                            Command::Arm(n) => {
                                armed.insert(n);
                            }
                            Command::Exec { reply, .. } | Command::Run { reply, .. } => {
                                let error = match original.take() {
                                    Some(e) => e,
                                    None => copy_error(&e_copy),
                                };
                                let _ = reply.send(Err(Failed { error, sent: false }));
                            }
                        }
                    }
                    if original.is_some() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
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
            failed = !arm_all(c, &ops, &armed, &mut retry, limit).await;
        }
        if !failed {
            match queue.pop_front() {
                Some(Command::Exec {
                    doorbell,
                    sql,
                    ring,
                    reply,
                }) => {
                    let full = match ring {
                        Ring::ArmIfAcquired => format!(
                            "{sql}; SELECT IF(ROW_COUNT() > 0 AND LAST_INSERT_ID() > 0 \
                             AND LAST_INSERT_ID() < {}, {}, NULL)",
                            MyOutcome::BUSY,
                            arm_expr(&doorbell)
                        ),
                        Ring::Disarm => format!("{sql}; DO RELEASE_LOCK('{doorbell}')"),
                    };
                    tracing::trace!(target: "distlock::probe", ev = match ring {
                        Ring::ArmIfAcquired => "my_sql_acquire_arm",
                        Ring::Disarm => "my_sql_release_disarm",
                    });
                    let out = bounded(limit, async {
                        match c.query_iter(full.as_str()).await {
                            Ok(r) => outcome(r).await,
                            Err(e) => Err(e),
                        }
                    })
                    .await;
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
                    let _ = reply.send(
                        out.map(|mut e| {
                            if ring == Ring::ArmIfAcquired {
                                e.rows.clear(); // the doorbell's own result
                            }
                            e
                        })
                        .map_err(|error| Failed { error, sent: true }),
                    );
                }
                // A statement whose caller went away before it started is skipped.
                Some(Command::Run { job, mut reply }) if !reply.is_closed() => {
                    tokio::select! {
                        out = bounded(limit, run(c, &job)) => {
                            if let Err(e) = &out {
                                // A broken connection, or a transaction that may still be
                                // open.
                                failed = matches!(classify(e), Class::Connection)
                                    || matches!(job, Job::Transaction(_));
                            }
                            let _ = reply.send(out.map_err(|error| Failed { error, sent: true }));
                        }
                        // The caller ran out of time with the statement under way: close the
                        // connection rather than wait for a server that may be stalled while
                        // the backend's other statements queue behind it.
                        () = reply.closed() => failed = true,
                    }
                }
                Some(Command::Run { .. }) => {}
                Some(Command::Arm(n)) => queue.push_front(Command::Arm(n)),
                None => {}
            }
        }
        if failed {
            id.store(0, Ordering::Release);
            if let Some(c) = conn.take() {
                discard(c);
            }
            check = true;
        }
    }
    if let Some(c) = conn {
        let _ = c.disconnect().await;
    }
}

/// Takes the doorbells `ops` (or, with none, just checks the connection); the ones found
/// taken go to `retry`. False when the connection failed.
async fn arm_all(
    c: &mut Conn,
    ops: &[String],
    armed: &HashSet<String>,
    retry: &mut HashSet<String>,
    limit: Duration,
) -> bool {
    if ops.is_empty() {
        tracing::trace!(target: "distlock::probe", ev = "my_sql_check");
        return match bounded(limit, c.query_first::<Row, _>("SELECT 1")).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(error = %e, "session check failed; reconnecting");
                false
            }
        };
    }
    for chunk in ops.chunks(BATCH) {
        let exprs: Vec<String> = chunk.iter().map(|n| arm_expr(n)).collect();
        let sql = format!("SELECT {}", exprs.join(", "));
        tracing::trace!(target: "distlock::probe", ev = "my_sql_arm");
        match bounded(limit, c.query_first::<Row, _>(&sql)).await {
            Ok(row) => {
                for (i, n) in chunk.iter().enumerate() {
                    if !took(row.as_ref(), i) && armed.contains(n) {
                        retry.insert(n.clone());
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "doorbell statement failed; reconnecting");
                return false;
            }
        }
    }
    true
}

async fn run(c: &mut Conn, job: &Job) -> std::result::Result<Outcome, mysql_async::Error> {
    match job {
        Job::Text(text) | Job::Transaction(text) => {
            outcome(c.query_iter(text.as_str()).await?).await
        }
        Job::Prepared(sql, values) => {
            outcome(c.exec_iter(sql.as_str(), values.clone()).await?).await
        }
    }
}

/// `fut`, or a timeout error after `limit`.
pub(crate) async fn bounded<T>(
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
