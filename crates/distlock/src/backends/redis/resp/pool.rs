//! The connection pool: at most a few connections to one server, and the line of requests
//! waiting for one, sent together in one write when a connection comes free.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::codec::encode;
use super::conn::Conn;
use super::{ConnInfo, Reply, RespError};

/// Connections to one server: at most `max_open` ([`MAX_OPEN`] unless set) in use at once, all
/// kept once opened.
///
/// A request that finds every connection in use waits in [`Line`], and goes out with the
/// others waiting there in one write, on the next connection that comes free: under load the
/// server reads and answers a batch of requests per system call instead of one, which is most
/// of what a request costs it. A request that finds a connection free is written at once by
/// its own task, as before.
pub(crate) struct Pool {
    pub(super) info: ConnInfo,
    idle: Mutex<Vec<Conn>>,
    /// Connections in use, and the requests waiting for one. Without a bound, a burst of
    /// concurrent requests (a registry acquiring 100,000 keys at once) would open a
    /// connection for each.
    line: Mutex<Line>,
    /// With Sentinel: the master the last connection went to.
    pub(super) master: Mutex<Option<String>>,
    /// Counts [`Pool::clear`]s: a connection opened before the last one is not kept.
    generation: AtomicU64,
    /// The most connections open at once, in use or idle.
    max_open: usize,
}

/// The default of `max_open`.
pub(crate) const MAX_OPEN: usize = 32;
/// The most requests one batch carries, so that its reply, and so each caller's, stays prompt.
const MAX_BATCH: usize = 256;

#[derive(Default)]
struct Line {
    /// Connections in use (or being opened), at most the pool's `max_open`.
    busy: usize,
    /// Requests waiting for a connection, first come first sent.
    waiting: VecDeque<Waiting>,
}

/// A request in [`Line`]: its commands, encoded, and where its outcome goes.
struct Waiting {
    request: Request,
    to: oneshot::Sender<Turn>,
}

/// Encoded commands and how many replies they get.
struct Request {
    out: Vec<u8>,
    count: usize,
}

/// What a waiting request is told.
enum Turn {
    /// Another request's task sent it along with its own: these are its replies.
    Answered(Result<Vec<Reply>, RespError>),
    /// A connection came free (`None`: a slot to open one in): send the request, with
    /// whatever else waits, and pass the connection on.
    Lead(Option<Conn>, Request),
}

impl Pool {
    pub(crate) fn new(info: ConnInfo) -> Self {
        Pool {
            info,
            idle: Mutex::new(Vec::new()),
            line: Mutex::new(Line::default()),
            master: Mutex::new(None),
            generation: AtomicU64::new(0),
            max_open: MAX_OPEN,
        }
    }

    /// At most `max_open` connections (at least 1) instead of [`MAX_OPEN`].
    pub(crate) fn with_max_open(mut self, max_open: usize) -> Self {
        self.max_open = max_open.max(1);
        self
    }

    /// Sends each command of `cmds` in one write and returns their replies in order. Error
    /// replies are returned as [`Reply::Error`]; only the transport fails the call. Waiting
    /// for a connection is not part of the response timeout.
    pub(crate) async fn pipeline<'a, C: AsRef<[&'a [u8]]>>(
        &self,
        cmds: &[C],
    ) -> Result<Vec<Reply>, RespError> {
        let size = cmds
            .iter()
            .map(|c| 16 + c.as_ref().iter().map(|a| a.len() + 16).sum::<usize>())
            .sum();
        let mut out = Vec::with_capacity(size);
        for cmd in cmds {
            encode(&mut out, cmd.as_ref());
        }
        let request = Request {
            out,
            count: cmds.len(),
        };
        // Decided under the lock, waited for after it (a `MutexGuard` is not `Send`).
        let queued = {
            let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
            if line.busy < self.max_open {
                line.busy += 1;
                Err(request)
            } else {
                let (to, from) = oneshot::channel();
                line.waiting.push_back(Waiting { request, to });
                Ok(from)
            }
        };
        let (conn, request) = match queued {
            Err(request) => {
                let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
                (idle, request)
            }
            Ok(from) => {
                let mut turn = TurnGuard { pool: self, from };
                match (&mut turn.from).await {
                    Ok(Turn::Answered(replies)) => return replies,
                    Ok(Turn::Lead(conn, request)) => (conn, request),
                    // Never dropped unanswered but by a batch dropped mid-exchange.
                    Err(_) => return Err(abandoned()),
                }
            }
        };
        let mut batch = Batch {
            pool: self,
            done: false,
            conn,
            own: request.count,
            out: request.out,
            count: request.count,
            others: Vec::new(),
        };
        batch.take_waiting();
        batch.send().await
    }

    /// Passes a connection that is done with (`None`: lost) to the first request waiting,
    /// else keeps it idle and frees its slot. A connection opened before the last
    /// [`clear`](Self::clear) goes no further (it may reach a node that is no longer the one
    /// to use): the request gets the slot and opens a new one.
    fn pass_on(&self, conn: Option<Conn>) {
        let generation = self.generation.load(Ordering::Acquire);
        let mut conn = conn.filter(|c| c.generation == generation);
        loop {
            let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
            let Some(w) = line.waiting.pop_front() else {
                line.busy -= 1;
                drop(line);
                // Only a connection whose replies were all read comes here: it is in step.
                if let Some(c) = conn {
                    let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                    if idle.len() < self.max_open
                        && c.generation == self.generation.load(Ordering::Acquire)
                    {
                        idle.push(c);
                    }
                }
                return;
            };
            drop(line);
            match w.to.send(Turn::Lead(conn, w.request)) {
                Ok(()) => return,
                // Its caller gave up: the next one.
                Err(Turn::Lead(c, _)) => conn = c,
                Err(Turn::Answered(_)) => conn = None,
            }
        }
    }

    /// The cluster node id its connections check, if any.
    pub(crate) fn node_id(&self) -> Option<&str> {
        self.info.node_id.as_deref()
    }

    /// Forgets idle connections (after a failure, they may all be broken; after a failover,
    /// they go to the old master), and those in use when they come back.
    pub(crate) fn clear(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        self.generation.fetch_add(1, Ordering::AcqRel);
        idle.clear();
    }

    async fn connect(&self) -> Result<Conn, RespError> {
        // Read before connecting: a `clear` while this connects makes it one not to keep.
        let generation = self.generation.load(Ordering::Acquire);
        let mut conn = self.connect_now().await?;
        conn.generation = generation;
        Ok(conn)
    }
}

/// The requests one connection carries in one write: its own task's first (`own` replies),
/// then those it took from the line, whose tasks wait for their replies.
struct Batch<'p> {
    pool: &'p Pool,
    /// Set once the connection is passed on or the slot given back; a batch dropped before
    /// (its caller gave up mid-exchange) frees its slot, and its connection, out of step, is
    /// closed.
    done: bool,
    conn: Option<Conn>,
    own: usize,
    out: Vec<u8>,
    count: usize,
    others: Vec<(usize, oneshot::Sender<Turn>)>,
}

impl Batch<'_> {
    /// Takes requests waiting in the line, up to [`MAX_BATCH`] in all; not those whose
    /// callers gave up (nothing of theirs is sent).
    fn take_waiting(&mut self) {
        let mut line = self.pool.line.lock().unwrap_or_else(|e| e.into_inner());
        while self.others.len() + 1 < MAX_BATCH {
            let Some(w) = line.waiting.pop_front() else {
                break;
            };
            if w.to.is_closed() {
                continue;
            }
            self.out.extend_from_slice(&w.request.out);
            self.count += w.request.count;
            self.others.push((w.request.count, w.to));
        }
    }

    /// Sends the batch, answers the others, passes the connection on and returns the own
    /// replies.
    async fn send(mut self) -> Result<Vec<Reply>, RespError> {
        let pool = self.pool;
        let result = loop {
            let e = match self.exchange().await {
                Err(e) if e.refused() => e,
                r => break r,
            };
            // The server is at its client limit. A connection this pool already has will
            // carry the batch when it comes free: a release must not fail for want of a
            // second connection while the first one works.
            let Some(from) = self.give_slot_back() else {
                break Err(e);
            };
            tracing::debug!("server at its client limit; waiting for a connection in use");
            let mut turn = TurnGuard { pool, from };
            match (&mut turn.from).await {
                Ok(Turn::Answered(replies)) => break replies,
                Ok(Turn::Lead(conn, request)) => {
                    self.done = false;
                    self.conn = conn;
                    self.out = request.out;
                }
                Err(_) => break Err(abandoned()),
            }
        };
        let result = result.map(|mut replies| {
            let mut rest = replies.split_off(self.own);
            for (count, to) in self.others.drain(..).rev() {
                let theirs = rest.split_off(rest.len() - count);
                let _ = to.send(Turn::Answered(Ok(theirs)));
            }
            replies
        });
        if let Err(e) = &result {
            for (_, to) in self.others.drain(..) {
                let _ = to.send(Turn::Answered(Err(e.copy())));
            }
        }
        if !self.done {
            self.done = true;
            self.pool.pass_on(self.conn.take());
        }
        result
    }

    /// Puts the whole batch at the head of the line and frees its slot, unless no other
    /// connection of the pool is in use (then none may come free, and the refusal stands).
    fn give_slot_back(&mut self) -> Option<oneshot::Receiver<Turn>> {
        let mut line = self.pool.line.lock().unwrap_or_else(|e| e.into_inner());
        if line.busy < 2 {
            return None;
        }
        line.busy -= 1;
        self.done = true;
        let (to, from) = oneshot::channel();
        let request = Request {
            out: std::mem::take(&mut self.out),
            count: self.count,
        };
        line.waiting.push_front(Waiting { request, to });
        Some(from)
    }

    async fn exchange(&mut self) -> Result<Vec<Reply>, RespError> {
        let pool = self.pool;
        let reused = self.conn.is_some();
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => pool.connect().await.map_err(unsent)?,
        };
        let timeout = pool.info.response_timeout;
        let no_reply = || io::Error::new(io::ErrorKind::TimedOut, "no reply in time");
        let replies = match tokio::time::timeout(timeout, conn.send(&self.out, self.count)).await {
            Ok(Err(RespError::Unsent(e))) if reused => {
                // An idle connection can go stale (its runtime was shut down, the server
                // closed it): nothing was sent, so the request goes out on a new one.
                tracing::debug!(error = %e, "idle connection unusable; reconnecting");
                pool.clear();
                conn = pool.connect().await.map_err(unsent)?;
                tokio::time::timeout(timeout, conn.send(&self.out, self.count))
                    .await
                    .map_err(|_| no_reply())??
            }
            r => r.map_err(|_| no_reply())??,
        };
        // Only a connection whose replies were all read goes on: it is in step again.
        self.conn = Some(conn);
        Ok(replies)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.pool.pass_on(None);
        }
    }
}

/// A place in [`Line`], for a request whose caller may give up: a connection handed to it
/// after that is passed on, never lost with its slot.
struct TurnGuard<'p> {
    pool: &'p Pool,
    from: oneshot::Receiver<Turn>,
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        self.from.close();
        if let Ok(Turn::Lead(conn, _)) = self.from.try_recv() {
            self.pool.pass_on(conn);
        }
    }
}

fn abandoned() -> RespError {
    RespError::Io(io::Error::other(
        "the batch carrying this request was abandoned",
    ))
}

/// A connection that could not be opened sent nothing: I/O errors of connecting are
/// [`RespError::Unsent`], so a caller knows it may send the request elsewhere.
fn unsent(e: RespError) -> RespError {
    match e {
        RespError::Io(e) => RespError::Unsent(e),
        other => other,
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
