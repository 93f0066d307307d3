//! The checker store: the data the lock protects, kept by the driver, and the log of every
//! critical section the workers report.
//!
//! It has two registers that every worker increments with a read-modify-write:
//!
//! - the **fenced** register behaves like storage that honours fencing tokens: it remembers the
//!   highest fence it has seen (on reads and on accepted writes) and rejects a write whose fence
//!   is lower. Independently of that rule it audits every accepted write: one whose fence is
//!   lower than a fence already accepted, or equal to the fence of another section, is a
//!   *stale write accepted* (two holders the fence cannot tell apart); one whose base is not
//!   the register's current value is a *lost update*.
//! - the **unfenced** register takes every write, as storage that ignores fences would, and
//!   counts the lost updates that causes: what fencing saved.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::proto::{Reply, Request, Role, SectionId};

/// One critical section as reported by its worker (times are `CLOCK_MONOTONIC` ns).
#[derive(Debug, Clone)]
pub(crate) struct Section {
    pub(crate) id: SectionId,
    pub(crate) role: Role,
    pub(crate) fence: u64,
    pub(crate) start: u64,
    /// When the worker ended it; `None` while open (or when the worker was killed in it).
    pub(crate) end: Option<u64>,
    /// When the guard's `lost()` completed, if it did before the section ended.
    pub(crate) lost: Option<u64>,
    pub(crate) wrote: bool,
    pub(crate) accepted: bool,
    pub(crate) held_after_write: bool,
}

/// One attempt of a worker process to take the lock, from the call to its end: the section
/// `id` began, the timed attempt gave up (`abandoned`), or the process was killed.
#[derive(Debug, Clone)]
pub(crate) struct Wait {
    pub(crate) id: SectionId,
    pub(crate) role: Role,
    pub(crate) start: u64,
    /// `None` while it waits.
    pub(crate) end: Option<u64>,
    pub(crate) abandoned: bool,
}

/// What the checker recorded of a run: every section and wait (open ones ended at the end of
/// the run), in order of start, and the counters.
pub(crate) struct Log {
    pub(crate) sections: Vec<Section>,
    pub(crate) waits: Vec<Wait>,
    pub(crate) counters: Counters,
}

/// The checker's counters, copied into the report.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    pub(crate) writes: u64,
    pub(crate) writes_accepted: u64,
    pub(crate) stale_writes_rejected: u64,
    pub(crate) stale_writes_accepted: u64,
    pub(crate) lost_updates: u64,
    pub(crate) unfenced_lost_updates: u64,
    pub(crate) value: u64,
    pub(crate) uvalue: u64,
}

#[derive(Default)]
struct State {
    counters: Counters,
    /// Highest fence the fenced register has seen, on a read or an accepted write.
    max_seen: u64,
    /// Highest fence of an accepted write.
    max_accepted: u64,
    /// Which section each accepted fence came from.
    accepted_by: HashMap<u64, SectionId>,
    sections: HashMap<SectionId, Section>,
    waits: HashMap<SectionId, Wait>,
    /// Until when each open section's worker said it would stay in it at least.
    busy_until: HashMap<SectionId, u64>,
    /// The open section of each worker slot, for the nemesis to aim at.
    open: HashMap<usize, SectionId>,
    /// Open sections whose write is on its way.
    writing: HashMap<usize, SectionId>,
    /// When each worker process (slot, life) was killed: its report of a section it entered
    /// just before may still be on its way, and that section ended with the process.
    dead: HashMap<(usize, u32), u64>,
}

/// The store and the section log, shared by the connection tasks and the driver.
#[derive(Clone, Default)]
pub(crate) struct Checker {
    state: Arc<Mutex<State>>,
}

impl Checker {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves workers on a fresh loopback port until the returned task is aborted.
    pub(crate) async fn serve(&self) -> io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let checker = self.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let checker = checker.clone();
                conns.spawn(async move {
                    let _ = checker.connection(stream).await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok((addr, task))
    }

    async fn connection(&self, stream: TcpStream) -> io::Result<()> {
        stream.set_nodelay(true)?;
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        while let Some(line) = lines.next_line().await? {
            let request: Request = serde_json::from_str(&line).map_err(io::Error::other)?;
            if let Some(reply) = self.handle(request) {
                let mut text = serde_json::to_string(&reply).map_err(io::Error::other)?;
                text.push('\n');
                write.write_all(text.as_bytes()).await?;
            }
        }
        Ok(())
    }

    /// Records a request as if a worker had sent it; the reply, for those that get one.
    pub(crate) fn handle(&self, request: Request) -> Option<Reply> {
        let mut s = self.state();
        let mut accepted = false;
        match request {
            Request::Waiting { id, t, role } => {
                // The section may have been reported first: the two travel apart.
                let end = s
                    .sections
                    .get(&id)
                    .map(|sec| sec.start)
                    .or_else(|| s.dead.get(&(id.worker, id.life)).copied());
                s.waits.entry(id).or_insert(Wait {
                    id,
                    role,
                    start: t,
                    end: end.map(|e| e.max(t)),
                    abandoned: false,
                });
                return None;
            }
            Request::Abandoned { id, t } => {
                if let Some(wait) = s.waits.get_mut(&id) {
                    if wait.end.is_none() {
                        wait.end = Some(t.max(wait.start));
                        wait.abandoned = true;
                    }
                }
                return None;
            }
            Request::Acquired {
                id,
                fence,
                t,
                role,
                busy_until,
            } => {
                if let Some(wait) = s.waits.get_mut(&id) {
                    wait.end = Some(wait.end.map_or(t, |e| e.min(t)).max(wait.start));
                }
                let died = s.dead.get(&(id.worker, id.life)).copied();
                s.sections.insert(
                    id,
                    Section {
                        id,
                        role,
                        fence,
                        start: t,
                        end: died.map(|d| d.max(t)),
                        lost: None,
                        wrote: false,
                        accepted: false,
                        held_after_write: false,
                    },
                );
                // The foreign client is no worker process the nemesis could aim at.
                if died.is_none() && role != Role::Foreign {
                    s.open.insert(id.worker, id);
                    s.busy_until.insert(id, busy_until);
                }
            }
            Request::Read { fence, .. } => s.max_seen = s.max_seen.max(fence),
            Request::Write {
                id,
                fence,
                base,
                ubase,
            } => {
                s.counters.writes += 1;
                // The unfenced register takes everything.
                if ubase != s.counters.uvalue {
                    s.counters.unfenced_lost_updates += 1;
                }
                s.counters.uvalue = ubase + 1;
                // The fenced register's rule.
                if fence >= s.max_seen {
                    accepted = true;
                    // The audit, independent of the rule.
                    let duplicate = s.accepted_by.get(&fence).is_some_and(|other| *other != id);
                    if fence < s.max_accepted || duplicate {
                        s.counters.stale_writes_accepted += 1;
                    }
                    if base != s.counters.value {
                        s.counters.lost_updates += 1;
                    }
                    s.counters.value = base + 1;
                    s.counters.writes_accepted += 1;
                    s.max_seen = fence;
                    s.max_accepted = s.max_accepted.max(fence);
                    s.accepted_by.insert(fence, id);
                } else {
                    s.counters.stale_writes_rejected += 1;
                }
                if let Some(section) = s.sections.get_mut(&id) {
                    section.accepted = accepted;
                }
            }
            Request::Writing { id } => {
                s.writing.insert(id.worker, id);
                return None;
            }
            Request::Lost { id, t } => {
                if let Some(section) = s.sections.get_mut(&id) {
                    if section.end.is_none_or(|end| t <= end) {
                        section.lost = Some(section.lost.map_or(t, |l| l.min(t)));
                    }
                }
                return None;
            }
            Request::End {
                id,
                t,
                lost,
                wrote,
                held_after_write,
            } => {
                if let Some(section) = s.sections.get_mut(&id) {
                    section.end = Some(t);
                    if let Some(l) = lost {
                        section.lost = Some(section.lost.map_or(l, |m| m.min(l)));
                    }
                    section.wrote = wrote;
                    section.held_after_write = held_after_write;
                    if section.lost.is_some_and(|l| l > t) {
                        section.lost = None;
                    }
                }
                if s.open.get(&id.worker) == Some(&id) {
                    s.open.remove(&id.worker);
                }
                s.busy_until.remove(&id);
                if s.writing.get(&id.worker) == Some(&id) {
                    s.writing.remove(&id.worker);
                }
            }
        }
        Some(Reply {
            value: s.counters.value,
            uvalue: s.counters.uvalue,
            accepted,
        })
    }

    /// The worker slot's open section, if it is in one.
    pub(crate) fn holder(&self) -> Option<usize> {
        self.holder_but(None)
    }

    /// The lowest worker slot other than `not` in an open section.
    pub(crate) fn holder_but(&self, not: Option<usize>) -> Option<usize> {
        let s = self.state();
        let mut open: Vec<usize> = s.open.keys().copied().filter(|w| Some(*w) != not).collect();
        open.sort_unstable();
        open.first().copied()
    }

    /// The worker slots waiting and not in a section (never the foreign client) that began
    /// their wait at `before` or earlier, the one that has waited longest first.
    pub(crate) fn waiters_since(&self, before: u64) -> Vec<usize> {
        let s = self.state();
        let mut waits: Vec<&Wait> = s
            .waits
            .values()
            .filter(|w| w.end.is_none() && w.role != Role::Foreign)
            .filter(|w| w.start <= before)
            .filter(|w| !s.open.contains_key(&w.id.worker))
            .collect();
        waits.sort_by_key(|w| w.start);
        waits.iter().map(|w| w.id.worker).collect()
    }

    /// The open section of a worker slot, if it is in one, and until when its worker said it
    /// would stay in it at least.
    pub(crate) fn open_section(&self, worker: usize) -> Option<(SectionId, u64)> {
        let s = self.state();
        let id = s.open.get(&worker).copied()?;
        Some((id, s.busy_until.get(&id).copied().unwrap_or(0)))
    }

    /// Whether a section has begun.
    pub(crate) fn any_acquired(&self) -> bool {
        !self.state().sections.is_empty()
    }

    /// The worker slot other than `not` whose write is on its way, if one's is.
    pub(crate) fn writer_but(&self, not: Option<usize>) -> Option<usize> {
        let s = self.state();
        s.writing.keys().copied().find(|w| Some(*w) != not)
    }

    /// Ends the open section of a worker that was killed at `t` (its own report never comes).
    pub(crate) fn killed(&self, worker: usize, life: u32, t: u64) {
        let mut s = self.state();
        s.dead.insert((worker, life), t);
        s.writing.remove(&worker);
        for wait in s.waits.values_mut() {
            if (wait.id.worker, wait.id.life) == (worker, life) && wait.end.is_none() {
                wait.end = Some(t.max(wait.start));
            }
        }
        if let Some(id) = s.open.remove(&worker) {
            if let Some(section) = s.sections.get_mut(&id) {
                section.end.get_or_insert(t);
            }
        }
    }

    /// Every section and wait, open ones ended at `t`, in order of start; and the counters.
    pub(crate) fn finish(&self, t: u64) -> Log {
        let s = self.state();
        let mut sections: Vec<Section> = s
            .sections
            .values()
            .cloned()
            .map(|mut sec| {
                sec.end.get_or_insert(t);
                sec
            })
            .collect();
        sections.sort_by_key(|sec| (sec.start, sec.id.worker));
        let mut waits: Vec<Wait> = s
            .waits
            .values()
            .cloned()
            .map(|mut w| {
                w.end.get_or_insert(t.max(w.start));
                w
            })
            .collect();
        waits.sort_by_key(|w| (w.start, w.id.worker));
        Log {
            sections,
            waits,
            counters: s.counters.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(worker: usize, seq: u64) -> SectionId {
        SectionId {
            worker,
            life: 0,
            seq,
        }
    }

    /// Reports an exclusive section entered at `t`.
    fn acquired(c: &Checker, id: SectionId, fence: u64, t: u64) {
        c.handle(Request::Acquired {
            id,
            fence,
            t,
            role: Role::Exclusive,
            busy_until: 0,
        });
    }

    /// Reports an exclusive wait begun at `t`.
    fn waiting(c: &Checker, id: SectionId, t: u64) {
        c.handle(Request::Waiting {
            id,
            t,
            role: Role::Exclusive,
        });
    }

    fn write(c: &Checker, id: SectionId, fence: u64, base: u64) -> bool {
        c.handle(Request::Write {
            id,
            fence,
            base,
            ubase: base,
        })
        .expect("writes are answered")
        .accepted
    }

    #[test]
    fn a_section_reported_after_its_worker_was_killed_ends_at_the_kill() {
        let c = Checker::default();
        // The worker entered its section just before the kill; its report arrives after.
        c.killed(0, 0, 1_000);
        acquired(&c, id(0, 1), 5, 900);
        assert_eq!(c.holder(), None);
        let log = c.finish(1_000_000);
        assert_eq!(log.sections[0].end, Some(1_000));
    }

    #[test]
    fn a_wait_ends_at_its_section_or_at_its_worker_s_death_whatever_comes_first() {
        let c = Checker::default();
        // The section's report overtook the wait's (they travel on two connections).
        acquired(&c, id(0, 1), 1, 500);
        waiting(&c, id(0, 1), 100);
        waiting(&c, id(1, 1), 200);
        assert_eq!(c.waiters_since(u64::MAX), vec![1]);
        c.killed(1, 0, 900);
        waiting(&c, id(2, 1), 300);
        c.handle(Request::Abandoned {
            id: id(2, 1),
            t: 400,
        });
        let log = c.finish(10_000);
        let ends: Vec<(usize, Option<u64>, bool)> = log
            .waits
            .iter()
            .map(|w| (w.id.worker, w.end, w.abandoned))
            .collect();
        assert_eq!(
            ends,
            vec![
                (0, Some(500), false),
                (1, Some(900), false),
                (2, Some(400), true)
            ]
        );
    }

    #[test]
    fn a_write_below_a_fence_already_seen_is_rejected_and_the_unfenced_register_loses_it() {
        let c = Checker::default();
        let (old, new) = (id(0, 1), id(1, 1));
        c.handle(Request::Read { id: old, fence: 10 });
        // The newer holder reads and writes while the old one is paused.
        c.handle(Request::Read { id: new, fence: 20 });
        assert!(write(&c, new, 20, 0));
        // The old holder's write arrives late, with its old fence and its old base.
        assert!(!write(&c, old, 10, 0));
        let n = c.finish(0).counters;
        assert_eq!(n.stale_writes_rejected, 1);
        assert_eq!(n.stale_writes_accepted, 0);
        assert_eq!(n.lost_updates, 0);
        assert_eq!(n.unfenced_lost_updates, 1);
        assert_eq!((n.value, n.uvalue), (1, 1));
    }

    #[test]
    fn two_sections_with_the_same_fence_count_as_a_stale_write_accepted() {
        let c = Checker::default();
        let (a, b) = (id(0, 1), id(1, 1));
        c.handle(Request::Read { id: a, fence: 7 });
        c.handle(Request::Read { id: b, fence: 7 });
        assert!(write(&c, a, 7, 0));
        // A store that compares numbers cannot tell b from a: accepted, and audited as stale.
        assert!(write(&c, b, 7, 0));
        let n = c.finish(0).counters;
        assert_eq!(n.stale_writes_accepted, 1);
        assert_eq!(n.lost_updates, 1);
    }
}
