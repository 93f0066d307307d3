//! Liveness: how long the lock stayed unavailable, held by no live worker while somebody
//! waited for it, beyond what the injected faults explain. The rule is that of docs/SAFETY.md
//! ("Liveness"); the allowances per backend are the one table [`BOUNDS`].

use std::time::Duration;

use serde::Serialize;

use crate::checker::{Section, Wait};
use crate::faults::{Fault, FaultKind};
use crate::proto::{ms, Role};

/// A time allowance: `lease_pct` percent of the run's lease plus `ms` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) lease_pct: u64,
    pub(crate) ms: u64,
}

impl Span {
    const fn ms(ms: u64) -> Span {
        Span { lease_pct: 0, ms }
    }

    const fn lease_plus(lease_pct: u64, ms: u64) -> Span {
        Span { lease_pct, ms }
    }

    /// The allowance in ns for `lease`.
    pub(crate) fn ns(self, lease: Duration) -> u64 {
        let lease = u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX);
        lease.saturating_mul(self.lease_pct) / 100 + self.ms * 1_000_000
    }
}

/// How long each kind of fault may keep the lock from its waiters on one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// A holder killed, paused, stalled or cut off: from the fault on, its lease plus the
    /// backend's slack (the time waiters need to notice that the lease ran out).
    pub(crate) holder: Span,
    /// A waiter killed, paused, stalled or cut off while somebody else held the lock: from the
    /// fault on, what its place in the line may still cost.
    pub(crate) waiter: Span,
    /// A server restart or leader kill: from the end of the fault (the server is back, the
    /// new leader or master is in place) on.
    pub(crate) recovery: Span,
    /// The server gives every lease a new term when a leader takes over (etcd's lessor
    /// renews each lease for its TTL; a ZooKeeper election gives each session a new
    /// timeout): the lease of a worker lost before the election runs again from its end.
    pub(crate) elections_renew_leases: bool,
}

/// The allowances per backend, the one place to adjust them as the backends' documented
/// bounds change. `holder`: a lost holder's lease plus the slack of waiters that poll at most
/// every 500 ms (`max_poll_interval`) and a scheduling margin of 250 ms; etcd's session is
/// 1.5 x the lease rounded up to whole seconds (3 s for the harness's 1.5 s) and etcd checks
/// expiries every 500 ms. `waiter`: Redis and Redlock queue places and hand-over grants live
/// `waiter_ttl` (2 s); a dead SQL waiter's writer place keeps readers out for 2 s, and MySQL's
/// doorbells leave a free lock to a head that does not come for 1 s; a distlock ZooKeeper
/// waiter's liveness mark lives in a waiter session of 2 s (the testkit's minimum session is
/// below that) plus a tick; etcd waiting keys live on a 2 s waiter lease, expired within
/// 500 ms; SQLite keeps no line. `recovery`: what
/// reconnecting, a failover or an election may take, plus, where the data survives, the lease
/// of a holder that lost its hold in the outage.
pub(crate) const BOUNDS: &[(&str, Bounds)] = &[
    (
        "sqlite",
        Bounds {
            holder: Span::lease_plus(100, 750),
            waiter: Span::ms(750),
            recovery: Span::ms(0),
            elections_renew_leases: false,
        },
    ),
    (
        "redis",
        Bounds {
            holder: Span::lease_plus(100, 750),
            waiter: Span::ms(2750),
            recovery: Span::ms(1500),
            elections_renew_leases: false,
        },
    ),
    (
        "redis-sentinel",
        Bounds {
            holder: Span::lease_plus(100, 750),
            waiter: Span::ms(2750),
            recovery: Span::lease_plus(100, 1500),
            elections_renew_leases: false,
        },
    ),
    (
        "redis-cluster",
        Bounds {
            holder: Span::lease_plus(100, 750),
            waiter: Span::ms(2750),
            recovery: Span::lease_plus(100, 1500),
            elections_renew_leases: false,
        },
    ),
    (
        "redlock",
        Bounds {
            holder: Span::lease_plus(101, 750),
            waiter: Span::ms(2750),
            recovery: Span::ms(1500),
            elections_renew_leases: false,
        },
    ),
    (
        "postgres",
        Bounds {
            holder: Span::lease_plus(100, 750),
            waiter: Span::ms(2750),
            recovery: Span::lease_plus(100, 1500),
            elections_renew_leases: false,
        },
    ),
    (
        "mysql",
        Bounds {
            holder: Span::lease_plus(100, 750),
            waiter: Span::ms(2750),
            recovery: Span::lease_plus(100, 1500),
            elections_renew_leases: false,
        },
    ),
    (
        "zookeeper",
        Bounds {
            holder: Span::lease_plus(100, 750),
            waiter: Span::ms(2750),
            recovery: Span::lease_plus(100, 2000),
            elections_renew_leases: true,
        },
    ),
    (
        "etcd",
        Bounds {
            holder: Span::lease_plus(200, 1000),
            waiter: Span::ms(3000),
            recovery: Span::lease_plus(200, 2000),
            elections_renew_leases: true,
        },
    ),
];

/// The allowances of `backend` (a name the table lacks gets none: every stretch counts).
pub(crate) fn bounds(backend: &str) -> Bounds {
    BOUNDS
        .iter()
        .find(|(name, _)| *name == backend)
        .map_or(NO_ALLOWANCE, |(_, b)| *b)
}

const NO_ALLOWANCE: Bounds = Bounds {
    holder: Span::ms(0),
    waiter: Span::ms(0),
    recovery: Span::ms(0),
    elections_renew_leases: false,
};

/// How long an attempt a worker sent just before a fault may take to reach the server: a
/// fault this close to the end of a section may have hit a worker the lock was passing to.
const IN_FLIGHT_NS: u64 = 100_000_000;

/// The stretches of the run in which the lock was unavailable without a fault to explain it.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Liveness {
    /// The longest unexplained stretch.
    pub(crate) max_unexplained_unavailable_ms: u64,
    /// All time in which somebody waited and no live worker held the lock (explained or not).
    pub(crate) unavailable_ms: u64,
    /// The unexplained stretches longer than a second (at most 10, longest first).
    pub(crate) unexplained: Vec<Stretch>,
}

/// One unexplained stretch, times in ms since the workers started.
#[derive(Debug, Serialize)]
pub(crate) struct Stretch {
    pub(crate) from_ms: f64,
    pub(crate) to_ms: f64,
    pub(crate) length_ms: u64,
    /// The last section that ended before it, and the first that began after it.
    pub(crate) before: Option<String>,
    pub(crate) after: Option<String>,
    /// Faults from two leases before it to its end, and how far each was allowed to reach.
    pub(crate) faults: Vec<String>,
}

type Pieces = Vec<(u64, u64)>;

/// A fault the whole server recovers from: a restart, a leader kill or a failover.
fn recovers(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::ServerRestart | FaultKind::LeaderKill | FaultKind::Failover
    )
}

/// Sorted, disjoint union of `pieces`.
fn union(mut pieces: Pieces) -> Pieces {
    pieces.retain(|(a, b)| a < b);
    pieces.sort_unstable();
    let mut out: Pieces = Vec::with_capacity(pieces.len());
    for (a, b) in pieces {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// `from` minus `cut`, both sorted and disjoint.
fn minus(from: &[(u64, u64)], cut: &[(u64, u64)]) -> Pieces {
    let mut out = Vec::new();
    for &(mut a, b) in from {
        for &(c, d) in cut {
            if d <= a || c >= b {
                continue;
            }
            if c > a {
                out.push((a, c));
            }
            a = a.max(d);
            if a >= b {
                break;
            }
        }
        if a < b {
            out.push((a, b));
        }
    }
    out
}

/// The run as the analysis sees it.
pub(crate) struct Run<'a> {
    pub(crate) sections: &'a [Section],
    pub(crate) waits: &'a [Wait],
    pub(crate) faults: &'a [Fault],
    pub(crate) bounds: Bounds,
    /// The run's lease, and that of each worker slot (the run's for slots not listed).
    pub(crate) lease: Duration,
    pub(crate) leases: &'a [Duration],
    /// How many may hold at once (1 but for semaphores).
    pub(crate) permits: u32,
    /// Where the analysis starts (the first acquisition) and ends; times are reported since
    /// `t0`.
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) t0: u64,
}

fn end_of(s: &Section) -> u64 {
    s.end.unwrap_or(s.start)
}

/// Until when a section held the lock as far as its worker knew.
fn held_until(s: &Section) -> u64 {
    s.lost.map_or(end_of(s), |l| l.min(end_of(s)))
}

fn label(s: &Section) -> String {
    s.id.label(s.role)
}

impl Run<'_> {
    /// The `SIGSTOP`s of a worker slot.
    fn paused(&self, worker: usize) -> Pieces {
        union(
            self.faults
                .iter()
                .filter(|f| f.kind == FaultKind::Pause && f.worker == Some(worker))
                .map(|f| (f.start, f.end))
                .collect(),
        )
    }

    /// Whether the worker `f` hit may have held the lock. Yes when it was in a section. No when
    /// others' sections kept it out from the fault to [`IN_FLIGHT_NS`] after it (an attempt it
    /// sent before has reached the server by then and found the lock held). Otherwise yes when
    /// a section ended within [`IN_FLIGHT_NS`] of the fault, so that the lock may have been
    /// passing to it; no when the lock had been unavailable for a while already.
    fn may_have_held(&self, f: &Fault, worker: usize) -> bool {
        let own = |s: &Section| s.id.worker == worker && s.role != Role::Foreign;
        if self
            .sections
            .iter()
            .any(|s| own(s) && s.start <= f.start && f.start <= end_of(s))
        {
            return true;
        }
        let role = self
            .waits
            .iter()
            .find(|w| w.id.worker == worker && w.role != Role::Foreign)
            .map_or(Role::Exclusive, |w| w.role);
        let blockers = self
            .sections
            .iter()
            .filter(|s| !own(s) && !s.role.shares_with(role))
            .filter(|s| s.start <= f.start && held_until(s) >= f.start + IN_FLIGHT_NS)
            .count();
        let needed = if role == Role::Permit {
            self.permits
        } else {
            1
        };
        if blockers >= needed as usize {
            return false;
        }
        self.sections
            .iter()
            .any(|s| end_of(s).abs_diff(f.start) <= IN_FLIGHT_NS)
    }

    /// Where the server renews leases at elections: how far the window of a lost worker's
    /// fault at `start`, open `until`, reaches once every election that begins inside it
    /// (chained: each one may begin inside the window the one before extended) starts the
    /// lost worker's lease again from its end. `elections` in order of their start.
    fn renewed(
        elections: &[&Fault],
        start: u64,
        mut until: u64,
        span: Span,
        lease: Duration,
    ) -> u64 {
        for r in elections {
            if r.start >= start && r.start < until {
                until = until.max(r.end + span.ns(lease));
            }
        }
        until
    }

    /// How far each fault explains unavailability: `[from, until]`, in order of the faults. A
    /// fault on a waiter that comes while the lock is already unavailable without an
    /// explanation did not cause that outage (and a stuck lock must not be excused by the
    /// faults that happen to follow): its window begins only when that outage ends.
    fn explained(&self, unavailable: &[(u64, u64)]) -> Vec<(u64, u64, &Fault)> {
        let b = self.bounds;
        let mut faults: Vec<&Fault> = self.faults.iter().collect();
        faults.sort_by_key(|f| f.start);
        let elections: Vec<&Fault> = faults
            .iter()
            .copied()
            .filter(|r| recovers(r.kind))
            .collect();
        let mut out: Vec<(u64, u64, &Fault)> = Vec::new();
        for f in faults {
            // A worker's allowances count with its own lease (its session, on ZooKeeper).
            let lease = f
                .worker
                .and_then(|w| self.leases.get(w).copied())
                .unwrap_or(self.lease);
            // The end of the unexplained outage the fault came in, if it came in one.
            let inside = |(a, b): &(u64, u64)| *a <= f.start && f.start < *b;
            let stuck = unavailable
                .iter()
                .find(|p| inside(p))
                .filter(|_| !out.iter().any(|(a, b, _)| inside(&(*a, *b))))
                .map(|(_, end)| *end);
            let mut from = f.start;
            let (until, span) = match (f.kind, f.worker) {
                // Listed with the stretches it precedes, but a live worker that stops
                // waiting must leave nothing behind.
                (FaultKind::Abandon, _) => (f.start, None),
                (kind, _) if recovers(kind) => (f.end + b.recovery.ns(lease), None),
                (_, Some(w)) if self.may_have_held(f, w) => {
                    (f.start + b.holder.ns(lease), Some(b.holder))
                }
                _ => {
                    from = stuck.unwrap_or(f.start);
                    (f.start + b.waiter.ns(lease), Some(b.waiter))
                }
            };
            let until = match span {
                Some(span) if b.elections_renew_leases => {
                    Self::renewed(&elections, f.start, until, span, lease)
                }
                _ => until,
            };
            out.push((from.min(until), until, f));
        }
        out
    }

    /// The stretches in which somebody live waited and fewer than `permits` live workers
    /// held the lock.
    fn unavailable(&self) -> Pieces {
        let mut steps: Vec<(u64, i64, i64)> = Vec::new();
        let mut paused = std::collections::HashMap::new();
        let mut live = |worker: usize, foreign: bool, a: u64, b: u64| -> Pieces {
            if foreign {
                return vec![(a, b)];
            }
            let p = paused.entry(worker).or_insert_with(|| self.paused(worker));
            minus(&[(a, b)], p)
        };
        for s in self.sections {
            let foreign = s.role == Role::Foreign;
            for (a, b) in live(s.id.worker, foreign, s.start, held_until(s)) {
                steps.push((a, 0, 1));
                steps.push((b, 0, -1));
            }
        }
        for w in self.waits {
            let foreign = w.role == Role::Foreign;
            for (a, b) in live(w.id.worker, foreign, w.start, w.end.unwrap_or(self.to)) {
                steps.push((a, 1, 0));
                steps.push((b, -1, 0));
            }
        }
        steps.sort_unstable_by_key(|s| s.0);
        let (mut waiting, mut holding) = (0i64, 0i64);
        let mut out = Vec::new();
        let mut open: Option<u64> = None;
        let mut i = 0;
        while i < steps.len() {
            let t = steps[i].0;
            // Every change at one instant first: a hand-over is no gap.
            while i < steps.len() && steps[i].0 == t {
                waiting += steps[i].1;
                holding += steps[i].2;
                i += 1;
            }
            let down = waiting > 0 && holding < i64::from(self.permits);
            match (down, open) {
                (true, None) => open = Some(t),
                (false, Some(a)) => {
                    out.push((a, t));
                    open = None;
                }
                _ => {}
            }
        }
        if let Some(a) = open {
            out.push((a, self.to));
        }
        out.into_iter()
            .map(|(a, b)| (a.max(self.from), b.min(self.to)))
            .filter(|(a, b)| a < b)
            .collect()
    }

    /// The liveness figures of the run.
    pub(crate) fn analyse(&self) -> Liveness {
        let unavailable = self.unavailable();
        let explained = self.explained(&unavailable);
        let cover = union(explained.iter().map(|(a, b, _)| (*a, *b)).collect());
        let mut left = minus(&unavailable, &cover);
        left.sort_by_key(|(a, b)| std::cmp::Reverse(b - a));
        let two_leases = 2 * u64::try_from(self.lease.as_nanos()).unwrap_or(0);
        let unexplained = left
            .iter()
            .take_while(|(a, b)| b - a > 1_000_000_000)
            .take(10)
            .map(|&(a, b)| Stretch {
                from_ms: ms(a - self.t0),
                to_ms: ms(b - self.t0),
                length_ms: (b - a) / 1_000_000,
                before: self
                    .sections
                    .iter()
                    .filter(|s| end_of(s) <= a)
                    .max_by_key(|s| end_of(s))
                    .map(label),
                after: self.sections.iter().find(|s| s.start >= b).map(label),
                faults: explained
                    .iter()
                    .filter(|(s, _, _)| *s + two_leases >= a && *s <= b)
                    .map(|(s, until, f)| {
                        format!(
                            "{}{} at {} ms, explains to {} ms",
                            f.kind.name(),
                            f.worker.map(|w| format!(" of w{w}")).unwrap_or_default(),
                            ms(s - self.t0),
                            ms(until - self.t0)
                        )
                    })
                    .collect(),
            })
            .collect();
        Liveness {
            max_unexplained_unavailable_ms: left.first().map_or(0, |(a, b)| (b - a) / 1_000_000),
            unavailable_ms: unavailable.iter().map(|(a, b)| b - a).sum::<u64>() / 1_000_000,
            unexplained,
        }
    }
}

#[cfg(test)]
#[path = "liveness_tests.rs"]
mod tests;
