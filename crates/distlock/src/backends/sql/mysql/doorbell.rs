//! Release notifications for MySQL/MariaDB, which have no `NOTIFY`: a "doorbell" per lock made
//! of a named user lock (`GET_LOCK`).
//!
//! - The **holder's** backend takes the lock's doorbell (`GET_LOCK(name, 0)`) on the session
//!   (statement connection, see `session.rs`) that the lock's statements run on, while it
//!   holds a lock that others want, and gives it back (`RELEASE_LOCK`) in the same round trip
//!   as the release. A lock seen contended lately (busy, or marked wanted by a waiter) is
//!   taken with the doorbell in the same round trip; otherwise the doorbell is taken after the
//!   acquisition, only if a waiter marked the row wanted. Uncontended locks cost no doorbell
//!   statement at all.
//! - A **waiter's** backend has one listener connection, whatever the number of locks it
//!   waits for: it watches one lock at a time, and moves on to the next waited-for lock when
//!   nobody in the process waits for its lock any more (the waiters of the others poll
//!   meanwhile). The listeners of all processes first queue for the lock's *turnstile*
//!   (`GET_LOCK` on a second name), which
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
//! Session-scoped `GET_LOCK`s are taken only on connections the backend owns for its life
//! (sessions and the listener), never lent to anybody else.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row};
use tokio::sync::Notify;

use super::session::{acquired, Failed, Job, Outcome, Ring, Session};
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
/// How long a lock counts as contended after it was last seen busy or waited for.
const CONTENDED_FOR: Duration = Duration::from_secs(2);
/// Most locks remembered as contended.
const MAX_CONTENDED: usize = 10_000;
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
/// After a wake-up the woken waiter's attempt is under way: the listener looks at the lock
/// again once that attempt has an outcome (taken: the listener gives the turnstile back; busy:
/// somebody else took it), and at the latest after this (a waiter that was woken but does not
/// attempt, because it gave up or its process is slow). A look while the attempt runs finds
/// the lock still free or taken by this process, and costs a statement that the turnstile's
/// hand-over to the next process then waits behind.
const AFTER_FIRE: Duration = Duration::from_millis(2);
/// The place a waiter reports (`Attempt::Busy::ahead`) while its process's listener stands in
/// the lock's turnstile line or at its head: it is woken in its turn, so its polls only guard
/// against a line that does not move (a process at the head that stopped), which
/// [`HEAD_GRACE_MS`] bounds as well. MariaDB does not tell a `GET_LOCK` line's length, so this
/// is not the real place but the pace it buys: `max_poll_interval` × 3 (1.5 s by default),
/// which keeps a stopped head's cost within the head grace plus one such poll.
pub(crate) const IN_LINE_AHEAD: u32 = 4;

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

/// The turnstile of a lock (see [`listener`]), named after its doorbell.
fn turnstile_name(doorbell: &str) -> String {
    doorbell.replacen("distlock-", "distlockq-", 1)
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
    /// Attempts of this backend at the lock that ended busy (see [`Doorbells::tried`]).
    tried: AtomicU64,
}

/// A lock the listener watches, or is asked to watch next.
struct Target {
    doorbell: String,
    /// The in-process channel of the lock's waiters.
    channel: String,
    /// The dialect's `doorbell_wait` statement for the lock.
    sql: String,
}

/// The backend's one listener: the lock it watches and the locks waited for meanwhile.
#[derive(Default)]
struct Listeners {
    /// The lock the listener watches, and how to tell it news; `None` when no listener runs.
    current: Option<(String, Arc<Listening>)>,
    /// Locks waited for while the listener watches another, in the order they were asked for;
    /// their waiters poll until the listener comes to them.
    pending: VecDeque<Target>,
}

/// The doorbells of one backend instance.
pub(crate) struct Doorbells {
    opts: Opts,
    /// The statement connections; a lock always uses the same one (by its doorbell's name), so
    /// that its doorbell is taken and given back on one session, in order.
    sessions: Vec<Session>,
    /// Which session runs the next statement that concerns no doorbell.
    next: AtomicUsize,
    listeners: Mutex<Listeners>,
    /// Doorbells taken (or being taken) for this backend's holds.
    armed: Mutex<HashSet<String>>,
    /// When this backend last saw each lock contended (busy, or waited for).
    contended: Mutex<HashMap<String, Instant>>,
}

impl Doorbells {
    /// Starts `n` session tasks (each connects on first use, see [`Session::start`]).
    pub(crate) fn new(opts: Opts, n: usize, connect: Duration, limit: Duration) -> Arc<Self> {
        let sessions = (0..n.max(1))
            .map(|_| Session::start(opts.clone(), connect, limit))
            .collect();
        Arc::new(Doorbells {
            opts,
            sessions,
            next: AtomicUsize::new(0),
            listeners: Mutex::new(Listeners::default()),
            armed: Mutex::new(HashSet::new()),
            contended: Mutex::new(HashMap::new()),
        })
    }

    fn session(&self, doorbell: &str) -> &Session {
        let h = doorbell.bytes().fold(0usize, |h, b| {
            h.wrapping_mul(31).wrapping_add(usize::from(b))
        });
        &self.sessions[h % self.sessions.len()]
    }

    /// Runs a statement that concerns no doorbell, on the sessions in turn.
    pub(crate) async fn run(&self, job: Job) -> std::result::Result<Outcome, Failed> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.sessions.len();
        self.sessions[i].run(job).await
    }

    /// Whether a connection id is one of this backend's sessions.
    fn is_ours(&self, id: u64) -> bool {
        id != 0 && self.sessions.iter().any(|r| u64::from(r.id()) == id)
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
    /// doorbell in the same round trip instead of afterwards.
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
        self.session(&doorbell).arm(doorbell);
    }

    /// Runs `sql` on the session of `doorbell`, with the doorbell taken or given back in the
    /// same round trip (see [`Ring`]). The statement runs to its end even if the caller stops
    /// waiting.
    pub(crate) async fn exec(
        &self,
        doorbell: &str,
        sql: String,
        ring: Ring,
    ) -> std::result::Result<Outcome, Failed> {
        let answer = {
            let mut armed = self.armed();
            match ring {
                Ring::ArmIfAcquired => armed.insert(doorbell.to_owned()),
                Ring::Disarm => armed.remove(doorbell),
            };
            self.session(doorbell).exec(doorbell, sql, ring)
        };
        let out = answer.wait().await;
        if ring == Ring::ArmIfAcquired {
            let taken = matches!(&out, Ok(e) if acquired(e));
            if !taken {
                self.armed().remove(doorbell);
            }
        }
        out
    }

    fn listeners(&self) -> std::sync::MutexGuard<'_, Listeners> {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure the backend's listener watches `doorbell` and fires `channel` of `signals`
    /// when it rings, for as long as `channel` has subscribers: at once when no listener runs
    /// (it starts) or when it watches this lock, else once it is done with the lock it
    /// watches (the waiters poll meanwhile).
    pub(crate) fn listen(
        self: &Arc<Self>,
        doorbell: String,
        channel: String,
        sql: String,
        signals: &Arc<ReleaseSignals>,
    ) {
        let mut l = self.listeners();
        let target = Target {
            doorbell,
            channel,
            sql,
        };
        match &l.current {
            Some((d, wake)) if *d == target.doorbell => wake.wake.notify_one(),
            Some((_, wake)) => {
                let wake = wake.clone();
                if !l.pending.iter().any(|t| t.doorbell == target.doorbell) {
                    l.pending.push_back(target);
                }
                // An idle listener moves on to it at once.
                wake.wake.notify_one();
            }
            None => {
                let wake = Arc::new(Listening::default());
                l.current = Some((target.doorbell.clone(), wake.clone()));
                tokio::spawn(listener(
                    Arc::downgrade(self),
                    target,
                    Arc::downgrade(signals),
                    wake,
                ));
            }
        }
    }

    /// The next lock for a listener done with its own: the first pending one that is still
    /// waited for. Decided under the same mutex as [`listen`](Self::listen) queues one.
    fn next_target(&self, signals: &ReleaseSignals) -> Option<(Target, Arc<Listening>)> {
        let mut l = self.listeners();
        while let Some(t) = l.pending.pop_front() {
            if signals.has_subscribers(&t.channel) {
                let wake = Arc::new(Listening::default());
                l.current = Some((t.doorbell.clone(), wake.clone()));
                return Some((t, wake));
            }
        }
        None
    }

    /// Ends an idle listener unless somebody waits again; decided under the same mutex as
    /// [`listen`](Self::listen) starts one, so a new waiter never finds a listener that is
    /// about to stop.
    fn stop_listening(&self, channel: &str, signals: &ReleaseSignals) -> bool {
        let mut l = self.listeners();
        if signals.has_subscribers(channel)
            || l.pending
                .iter()
                .any(|t| signals.has_subscribers(&t.channel))
        {
            return false;
        }
        *l = Listeners::default();
        true
    }

    /// The listener of `doorbell`'s news, if it watches that lock.
    fn watching(&self, doorbell: &str) -> Option<Arc<Listening>> {
        match &self.listeners().current {
            Some((d, wake)) if d == doorbell => Some(wake.clone()),
            _ => None,
        }
    }

    /// This backend took the lock of `doorbell` (see [`Listening::acquired`]).
    pub(crate) fn acquired(&self, doorbell: &str) {
        if let Some(l) = self.watching(doorbell) {
            l.acquired.store(true, Ordering::Release);
            l.wake.notify_one();
        }
    }

    /// An attempt of this backend at the lock of `doorbell` found it busy: a listener that
    /// woke a waiter for it looks at the lock again (somebody else took it).
    pub(crate) fn tried(&self, doorbell: &str) {
        if let Some(l) = self.watching(doorbell) {
            l.tried.fetch_add(1, Ordering::AcqRel);
            l.wake.notify_one();
        }
    }

    /// Whether this backend's listener watches `doorbell` (in the turnstile's line or at its
    /// head), so that a release wakes its waiters in their turn (see [`IN_LINE_AHEAD`]).
    pub(crate) fn watched(&self, doorbell: &str) -> bool {
        self.watching(doorbell).is_some()
    }

    /// Whether this backend's waiters of `doorbell` are in line behind another process's,
    /// which a free lock is left to for [`HEAD_GRACE_MS`].
    pub(crate) fn behind(&self, doorbell: &str) -> bool {
        self.watching(doorbell)
            .is_some_and(|l| l.behind.load(Ordering::Acquire))
    }

    /// The ids of this backend's sessions, as an SQL list.
    fn own_sessions(&self) -> String {
        let ids: Vec<String> = self.sessions.iter().map(|r| r.id().to_string()).collect();
        ids.join(", ")
    }
}

/// The backend's waiter connection, on one doorbell at a time. `target.sql` is the dialect's
/// `doorbell_wait` statement: it returns at once when the lock is free, else waits for the
/// doorbell to be given back.
///
/// The waiters of all processes queue for the lock's *turnstile*, another named lock: only the
/// listener that holds it watches the doorbell and wakes its process, so a release wakes one
/// process (in the order they came, as the server grants named locks) instead of all of them,
/// each of which would take a statement and a round of attempts. The turnstile is given back
/// as soon as nobody in this process waits any more (its waiter took the lock, or gave up);
/// the listener then moves on to the next lock this process waits for, if any, on the same
/// connection. An idle listener keeps its connection for [`IDLE_KEEP`], for the next wait.
async fn listener(
    bells: Weak<Doorbells>,
    mut target: Target,
    signals: Weak<ReleaseSignals>,
    mut wake: Arc<Listening>,
) {
    let mut turnstile = turnstile_name(&target.doorbell);
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
        if acquired || !s.has_subscribers(&target.channel) {
            if have_turnstile {
                if let Some(c) = conn.as_mut() {
                    tracing::trace!(target: "distlock::probe", ev = "my_turnstile_give");
                    if c.query_drop(format!("DO RELEASE_LOCK('{turnstile}')"))
                        .await
                        .is_err()
                    {
                        conn = None;
                    }
                }
                have_turnstile = false;
            }
            if s.has_subscribers(&target.channel) {
                continue; // another waiter of this process: queue again
            }
            if let Some((next, news)) = b.next_target(&s) {
                // Another lock of this process is waited for: watch it, on this connection.
                target = next;
                wake = news;
                turnstile = turnstile_name(&target.doorbell);
                (backoff, last_ring, last_fire) = (Duration::ZERO, None, None);
                continue;
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
            if b.stop_listening(&target.channel, &s) {
                break;
            }
            continue;
        }
        if conn.is_none() {
            have_turnstile = false;
            match Conn::new(b.opts.clone()).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    // Waiters poll; the next wait starts a listener again.
                    tracing::debug!(error = %e, "doorbell listener cannot connect; polling");
                    *b.listeners() = Listeners::default();
                    // Its waiters may sleep a safety poll (they were watched): they attempt
                    // now, and poll at the registry's pace from then on.
                    s.fire(&target.channel);
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
            tracing::trace!(target: "distlock::probe", ev = "my_turnstile");
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
        tracing::trace!(target: "distlock::probe", ev = "my_bell_wait");
        let statement = target.sql.replace("OWN_SESSIONS", &b.own_sessions());
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
        // Busy attempts counted before the waiters are woken, so that none is missed.
        let seen = wake.tried.load(Ordering::Acquire);
        let fire = || {
            if let Some(s) = signals.upgrade() {
                s.fire(&target.channel);
            }
        };
        tracing::trace!(target: "distlock::probe", ev = "my_bell_returned");
        if rang && own {
            // Our own holder gave the doorbell back: its release woke this process already.
            last_ring = Some((Instant::now(), version));
            backoff = Duration::ZERO;
        } else if rang && (waited || held_by != 0) {
            // A holder gave the doorbell back after its release committed.
            tracing::trace!(target: "distlock::probe", ev = "my_ring");
            fire();
            last_ring = Some((Instant::now(), version));
            backoff = Duration::ZERO;
            until_tried(&wake, seen, AFTER_FIRE).await;
        } else if free {
            // Free without a ring: the holder's lease ran out, or it does not ring (Spring's
            // registry), or a ring just woke the waiters, one of which is taking the lock
            // (until it commits, the row still reads free, at the version of the ring). Look,
            // unless it is that last case, and wait a little, so that a lock nobody takes
            // costs no busy loop.
            let settling =
                last_ring.is_some_and(|(t, v)| v == version && t.elapsed() < RING_SETTLE);
            if settling {
                tracing::trace!(target: "distlock::probe", ev = "my_settling");
                pause(&wake, MIN_BACKOFF).await;
                continue;
            }
            tracing::trace!(target: "distlock::probe", ev = "my_free");
            fire();
            // Still the version of the last wake-up: nobody took the lock since, so back off;
            // a new version means the lock is changing hands, and its next holder rings soon.
            let again = last_fire == Some(version);
            backoff = if again {
                next_backoff(backoff)
            } else {
                MIN_BACKOFF
            };
            last_fire = Some(version);
            until_tried(&wake, seen, AFTER_FIRE).await;
            if again && !wake.acquired.load(Ordering::Acquire) {
                pause(&wake, backoff).await;
            }
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

/// Waits until an attempt of this backend found the lock busy since `seen`, or it took the
/// lock, or `d` passed.
async fn until_tried(l: &Listening, seen: u64, d: Duration) {
    let deadline = tokio::time::Instant::now() + d;
    while l.tried.load(Ordering::Acquire) == seen && !l.acquired.load(Ordering::Acquire) {
        if tokio::time::timeout_at(deadline, l.wake.notified())
            .await
            .is_err()
        {
            return;
        }
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
