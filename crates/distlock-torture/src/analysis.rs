//! From the sections the workers reported, the faults the nemesis injected and the checker's
//! counters to the numbers of the report. The definitions are those of docs/SAFETY.md.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::checker::{Log, Section, Wait};
use crate::faults::{Fault, FaultKind};
use crate::liveness::{self, Stretch};
use crate::proto::{ms, Role};

/// The report of one backend.
#[derive(Debug, Serialize)]
pub(crate) struct BackendReport {
    pub(crate) backend: String,
    /// The kind of lock the workers took: `mutex`, `rw` (even workers write, odd ones read) or
    /// `semaphore(N)`.
    pub(crate) lock: String,
    /// A semaphore's permits.
    pub(crate) permits: Option<u32>,
    pub(crate) lease_ms: u64,
    pub(crate) run_ms: u64,
    /// Critical sections entered (successful `lock()` calls).
    pub(crate) acquisitions: usize,
    /// Whether the backend issues fences (Redlock does not): without them, stale writes,
    /// fence regressions and lost updates are expected and reported, not failures.
    pub(crate) fencing: bool,
    /// Injected faults per kind; every kind the backend supports is listed, also with 0.
    pub(crate) faults: BTreeMap<&'static str, usize>,
    /// Pauses that hit a holder after its last check, with its write on the way.
    pub(crate) pauses_at_write: usize,
    /// Faults the nemesis tried but could not inject, with the reason.
    pub(crate) fault_errors: Vec<String>,
    pub(crate) stale_writes_accepted: u64,
    pub(crate) stale_writes_rejected: u64,
    /// Two sections at once while neither was told the lock was lost, where their kinds
    /// exclude each other (any two of a mutex; a writer and anyone of a read-write lock).
    pub(crate) unannounced_overlaps: usize,
    /// Times more permit holders than permits were inside at once, none of them told or
    /// paused (semaphores).
    pub(crate) over_admissions: usize,
    pub(crate) max_lost_notice_ms: u64,
    /// Overlaps in which one of the two sections spans a `SIGSTOP` of its worker (allowed:
    /// fences cover them).
    pub(crate) overlaps_with_paused: usize,
    /// Overlaps of the foreign client (plain `SET NX`, no `WAIT`) with a worker while the
    /// master moved (a failover, injected or the Sentinels' own, from 1 s before to 3 s
    /// after): Redis replicates asynchronously, so a client that does not wait for a replica
    /// may take a key on the deposed master. Reported, not judged: distlock cannot make
    /// another client wait.
    pub(crate) foreign_overlaps_in_failover: usize,
    /// Acquisitions whose fence was not above that of a section that had ended before.
    pub(crate) fence_regressions: usize,
    /// Accepted writes of the fenced register whose base was not its current value.
    pub(crate) lost_updates: u64,
    /// The same for the register that ignores fences: what fencing saved.
    pub(crate) unfenced_lost_updates: u64,
    pub(crate) writes: u64,
    pub(crate) writes_accepted: u64,
    /// Sections in which `lost()` completed.
    pub(crate) lost_notices: usize,
    /// Sections that did not write because the lock was reported lost first.
    pub(crate) writes_skipped_after_loss: usize,
    /// Sections whose guard was no longer held right after the write returned.
    pub(crate) writes_not_held_after: usize,
    /// The longest time in which no worker was in a critical section (faults make the lock
    /// unavailable for a lease or so; much longer means waiters are stuck).
    pub(crate) longest_gap_ms: u64,
    /// The longest stretch in which somebody waited, no live worker held the lock and no
    /// injected fault explains it (docs/SAFETY.md, "Liveness").
    pub(crate) max_unexplained_unavailable_ms: u64,
    /// The run fails when `max_unexplained_unavailable_ms` is above this (3 s with `--quick`).
    pub(crate) max_unavailable_limit_ms: Option<u64>,
    /// All time in which somebody waited and no live worker held the lock.
    pub(crate) unavailable_ms: u64,
    /// The unexplained stretches over a second, longest first.
    pub(crate) unexplained_stretches: Vec<Stretch>,
    /// The foreign `SET NX` client's share (Redis backends).
    pub(crate) foreign: Option<ForeignReport>,
    /// The first overlaps in detail, times in ms since the workers started.
    pub(crate) overlap_details: Vec<OverlapDetail>,
}

/// How many times the foreign client must have tried before never being served fails a run.
const FOREIGN_TRIES: usize = 3;

/// What the foreign client (plain `SET NX PX`, compare-and-delete) saw.
#[derive(Debug, Default, Serialize)]
pub(crate) struct ForeignReport {
    /// Times it set out to take the lock.
    pub(crate) attempts: usize,
    /// Times it got it.
    pub(crate) served: usize,
    /// The longest it waited for the lock, served or not.
    pub(crate) longest_wait_ms: u64,
}

/// One unannounced overlap, for the report.
#[derive(Debug, Serialize)]
pub(crate) struct OverlapDetail {
    pub(crate) a: String,
    pub(crate) b: String,
    pub(crate) a_ms: [f64; 2],
    pub(crate) b_ms: [f64; 2],
    pub(crate) overlap_ms: f64,
    pub(crate) fences: [u64; 2],
    /// Whether each section's write was accepted by the fenced register.
    pub(crate) accepted: [bool; 2],
    /// Faults in force from one lease before the earlier section started to its end.
    pub(crate) faults: Vec<String>,
}

impl BackendReport {
    /// What makes the run fail, in words; empty when it passed.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.acquisitions == 0 {
            p.push("no acquisitions".to_owned());
        }
        if self.stale_writes_accepted > 0 && self.fencing {
            p.push(format!(
                "{} stale writes accepted",
                self.stale_writes_accepted
            ));
        }
        if self.unannounced_overlaps > 0 {
            p.push(format!(
                "{} unannounced overlaps",
                self.unannounced_overlaps
            ));
        }
        if self.over_admissions > 0 {
            p.push(format!(
                "{} times more holders than permits",
                self.over_admissions
            ));
        }
        if self.fence_regressions > 0 && self.fencing {
            p.push(format!("{} fence regressions", self.fence_regressions));
        }
        if self.lost_updates > 0 && self.fencing {
            p.push(format!("{} lost updates under fencing", self.lost_updates));
        }
        if let Some(limit) = self
            .max_unavailable_limit_ms
            .filter(|l| self.max_unexplained_unavailable_ms > *l)
        {
            p.push(format!(
                "unavailable for {} ms without a fault to explain it (limit {limit} ms)",
                self.max_unexplained_unavailable_ms
            ));
        }
        // Starving a while is what FIFO among distlock's waiters does to a client outside the
        // line under constant contention; never getting the key in several patient tries is not.
        if let Some(f) = self
            .foreign
            .as_ref()
            .filter(|f| f.attempts >= FOREIGN_TRIES && f.served == 0)
        {
            p.push(format!(
                "the foreign client was never served in {} attempts",
                f.attempts
            ));
        }
        for (kind, n) in &self.faults {
            if *n == 0 {
                p.push(format!("fault {kind} never injected"));
            }
        }
        p
    }
}

impl BackendReport {
    /// The run of one backend in a line: what ran, the safety figures (fenced backends only
    /// promise fences), liveness, and what failed.
    pub(crate) fn summary(&self) -> String {
        let problems = self.problems();
        let fences = if self.fencing {
            format!("stale writes accepted {}", self.stale_writes_accepted)
        } else {
            "no fences (not promised)".to_owned()
        };
        let foreign = self
            .foreign
            .as_ref()
            .map(|f| {
                let moved = match self.foreign_overlaps_in_failover {
                    0 => String::new(),
                    n => format!(" (overlapped a worker {n} times while the master moved)"),
                };
                format!(", foreign client served {}/{}{moved}", f.served, f.attempts)
            })
            .unwrap_or_default();
        format!(
            "{} ({}): {} acquisitions, faults {:?}, {fences}, unannounced overlaps {}, \
             max lost notice {} ms, max unexplained unavailable {} ms{foreign}{}",
            self.backend,
            self.lock,
            self.acquisitions,
            self.faults,
            self.unannounced_overlaps,
            self.max_lost_notice_ms,
            self.max_unexplained_unavailable_ms,
            if problems.is_empty() {
                " -- ok".to_owned()
            } else {
                format!(" -- FAILED: {}", problems.join("; "))
            }
        )
    }
}

fn label(s: &Section) -> String {
    s.id.label(s.role)
}

/// Builds the report of one backend.
#[allow(clippy::too_many_arguments)]
pub(crate) fn analyse(
    backend: &str,
    kinds: &[FaultKind],
    faults: &[Fault],
    fault_errors: Vec<String>,
    log: &Log,
    lease: Duration,
    leases: &[Duration],
    permits: u32,
    t0: u64,
    t_end: u64,
) -> BackendReport {
    let (sections, counters) = (&log.sections[..], &log.counters);
    let end_of = |s: &Section| s.end.unwrap_or(s.start);
    // A section is paused when a SIGSTOP of its worker slot overlaps it.
    let paused = |s: &Section| {
        faults.iter().any(|f| {
            f.kind == FaultKind::Pause
                && f.worker == Some(s.id.worker)
                && f.start <= end_of(s)
                && s.start <= f.end
        })
    };
    // Until when a section ran without its worker having been told the lock was lost.
    let unannounced_until = |s: &Section| s.lost.map_or(end_of(s), |l| l.min(end_of(s)));

    // While the master moves: from 1 s before a failover to 3 s after it.
    let in_failover = |from: u64, to: u64| {
        faults.iter().any(|f| {
            matches!(f.kind, FaultKind::Failover | FaultKind::LeaderKill)
                && f.start.saturating_sub(1_000_000_000) <= to
                && from <= f.end + 3_000_000_000
        })
    };
    let mut overlaps = 0;
    let mut with_paused = 0;
    let mut foreign_in_failover = 0;
    let mut details = Vec::new();
    for (i, a) in sections.iter().enumerate() {
        for b in &sections[i + 1..] {
            if b.start > end_of(a) {
                break;
            }
            if (a.id.worker == b.id.worker && a.id.life == b.id.life) || a.role.shares_with(b.role)
            {
                continue;
            }
            let from = a.start.max(b.start);
            let to = unannounced_until(a).min(unannounced_until(b));
            if from >= to {
                continue;
            }
            if paused(a) || paused(b) {
                with_paused += 1;
                continue;
            }
            if (a.role == Role::Foreign || b.role == Role::Foreign) && in_failover(from, to) {
                foreign_in_failover += 1;
                continue;
            }
            overlaps += 1;
            if details.len() < 20 {
                let window_start = a.start.saturating_sub(lease.as_nanos() as u64);
                let window_end = end_of(a).max(end_of(b));
                let active = faults
                    .iter()
                    .filter(|f| f.start <= window_end && window_start <= f.end)
                    .map(|f| {
                        format!(
                            "{}{} at {}..{} ms",
                            f.kind.name(),
                            f.worker.map(|w| format!(" of w{w}")).unwrap_or_default(),
                            ms(f.start - t0),
                            ms(f.end - t0)
                        )
                    })
                    .collect();
                details.push(OverlapDetail {
                    a: label(a),
                    b: label(b),
                    a_ms: [ms(a.start - t0), ms(end_of(a) - t0)],
                    b_ms: [ms(b.start - t0), ms(end_of(b) - t0)],
                    overlap_ms: ms(to - from),
                    fences: [a.fence, b.fence],
                    accepted: [a.accepted, b.accepted],
                    faults: active,
                });
            }
        }
    }

    // Permits: a sweep over the unannounced, unpaused stretches of the permit holders' sections;
    // each time more than `permits` are inside at once is one over-admission.
    let mut edges: Vec<(u64, i32)> = sections
        .iter()
        .filter(|s| s.role == Role::Permit && !paused(s))
        .flat_map(|s| [(s.start, 1), (unannounced_until(s), -1)])
        .collect();
    // Ends before starts at the same instant: a hand-over is no overlap.
    edges.sort_unstable();
    let (mut inside, mut over_admissions) = (0i64, 0usize);
    for (_, step) in edges {
        inside += i64::from(step);
        if step > 0 && inside > i64::from(permits) {
            over_admissions += 1;
        }
    }

    // Lost-notice delay: from the moment a section's lock demonstrably stopped being its own
    // (another worker acquired it, or the server came back without the data) to the moment
    // the holder was told (or, if never told, the end of its section).
    let mut max_notice = 0u64;
    for a in sections.iter().filter(|s| !paused(s)) {
        let later = sections.partition_point(|b| b.start <= a.start);
        let successor = sections[later..]
            .iter()
            .take_while(|b| b.start < end_of(a))
            .find(|b| {
                (b.id.worker != a.id.worker || b.id.life != a.id.life)
                    && !a.role.shares_with(b.role)
            })
            .map(|b| b.start);
        let loss = faults
            .iter()
            .filter(|f| f.data_loss && a.start < f.start && f.start < end_of(a))
            .map(|f| f.start);
        if let Some(invalid_at) = successor.into_iter().chain(loss).min() {
            let told = a.lost.unwrap_or(end_of(a));
            max_notice = max_notice.max(told.saturating_sub(invalid_at));
        }
    }

    // Fences must increase across holders: a section that started after another had ended
    // must carry a higher fence.
    // The foreign client has no fence.
    let fenced = || sections.iter().filter(|s| s.role != Role::Foreign);
    let mut by_end: Vec<(u64, u64)> = fenced().map(|s| (end_of(s), s.fence)).collect();
    by_end.sort_unstable();
    let highest_by_end: Vec<u64> = by_end
        .iter()
        .scan(0, |max, (_, f)| {
            *max = (*max).max(*f);
            Some(*max)
        })
        .collect();
    let mut regressions = 0;
    for s in fenced() {
        let before = by_end.partition_point(|(end, _)| *end < s.start);
        if before > 0 && highest_by_end[before - 1] >= s.fence {
            regressions += 1;
        }
    }

    let mut fault_counts: BTreeMap<&'static str, usize> =
        kinds.iter().map(|k| (k.name(), 0)).collect();
    for f in faults {
        *fault_counts.entry(f.kind.name()).or_default() += 1;
    }
    // Liveness: the longest stretch in which no worker was in a section.
    let mut longest_gap = 0u64;
    let mut covered_to = t0;
    for s in sections {
        longest_gap = longest_gap.max(s.start.saturating_sub(covered_to));
        covered_to = covered_to.max(end_of(s));
    }
    longest_gap = longest_gap.max(t_end.saturating_sub(covered_to));
    let live = liveness::Run {
        sections,
        waits: &log.waits,
        faults,
        bounds: liveness::bounds(backend),
        lease,
        leases,
        permits,
        from: sections.first().map_or(t_end, |s| s.start),
        to: t_end,
        t0,
    }
    .analyse();
    BackendReport {
        max_unexplained_unavailable_ms: live.max_unexplained_unavailable_ms,
        max_unavailable_limit_ms: None,
        unavailable_ms: live.unavailable_ms,
        unexplained_stretches: live.unexplained,
        foreign: None,
        fencing: true,
        backend: backend.to_owned(),
        lock: "mutex".to_owned(),
        permits: None,
        over_admissions,
        lease_ms: lease.as_millis() as u64,
        run_ms: t_end.saturating_sub(t0) / 1_000_000,
        longest_gap_ms: longest_gap / 1_000_000,
        acquisitions: sections.iter().filter(|s| s.role != Role::Foreign).count(),
        faults: fault_counts,
        pauses_at_write: faults.iter().filter(|f| f.at_write).count(),
        fault_errors,
        stale_writes_accepted: counters.stale_writes_accepted,
        stale_writes_rejected: counters.stale_writes_rejected,
        unannounced_overlaps: overlaps,
        max_lost_notice_ms: max_notice / 1_000_000,
        overlaps_with_paused: with_paused,
        foreign_overlaps_in_failover: foreign_in_failover,
        fence_regressions: regressions,
        lost_updates: counters.lost_updates,
        unfenced_lost_updates: counters.unfenced_lost_updates,
        writes: counters.writes,
        writes_accepted: counters.writes_accepted,
        lost_notices: sections.iter().filter(|s| s.lost.is_some()).count(),
        writes_skipped_after_loss: sections
            .iter()
            .filter(|s| !s.wrote && s.lost.is_some())
            .count(),
        writes_not_held_after: sections
            .iter()
            .filter(|s| s.wrote && !s.held_after_write)
            .count(),
        overlap_details: details,
    }
}

/// The run as text, one line per section, fault and wait of over a second in order of time (ms
/// since the workers started), for reading a failure.
pub(crate) fn timeline(sections: &[Section], waits: &[Wait], faults: &[Fault], t0: u64) -> String {
    let mut lines: Vec<(u64, String)> = sections
        .iter()
        .map(|s| {
            let end = s.end.unwrap_or(s.start);
            (
                s.start,
                format!(
                    "{:>10.2} .. {:>10.2}  {:<12} {:<9} fence {:<22} lost {:<10} wrote {} accepted {} held_after {}",
                    ms(s.start.saturating_sub(t0)),
                    ms(end.saturating_sub(t0)),
                    label(s),
                    s.role.name(),
                    s.fence,
                    s.lost.map_or("-".to_owned(), |l| format!("{:.2}", ms(l.saturating_sub(t0)))),
                    s.wrote,
                    s.accepted,
                    s.held_after_write
                ),
            )
        })
        .collect();
    lines.extend(
        waits
            .iter()
            .filter(|w| w.end.unwrap_or(w.start) - w.start > 1_000_000_000)
            .map(|w| {
                let end = w.end.unwrap_or(w.start);
                (
                    w.start,
                    format!(
                        "{:>10.2} .. {:>10.2}  WAIT {}{}",
                        ms(w.start.saturating_sub(t0)),
                        ms(end.saturating_sub(t0)),
                        w.id.label(w.role),
                        if w.abandoned { " (gave up)" } else { "" }
                    ),
                )
            }),
    );
    lines.extend(faults.iter().map(|f| {
        (
            f.start,
            format!(
                "{:>10.2} .. {:>10.2}  FAULT {}{}{}{}",
                ms(f.start - t0),
                ms(f.end - t0),
                f.kind.name(),
                f.worker.map(|w| format!(" of w{w}")).unwrap_or_default(),
                if f.data_loss { " (data lost)" } else { "" },
                if f.at_write {
                    " (write on its way)"
                } else {
                    ""
                }
            ),
        )
    }));
    lines.sort_by_key(|(t, _)| *t);
    lines.into_iter().map(|(_, l)| l + "\n").collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::SectionId;

    const MS: u64 = 1_000_000;
    const LEASE: Duration = Duration::from_millis(1000);

    fn section(worker: usize, fence: u64, start: u64, end: u64, lost: Option<u64>) -> Section {
        Section {
            role: Role::Exclusive,
            id: SectionId {
                worker,
                life: 0,
                seq: fence,
            },
            fence,
            start: start * MS,
            end: Some(end * MS),
            lost: lost.map(|l| l * MS),
            wrote: true,
            accepted: true,
            held_after_write: true,
        }
    }

    fn report(sections: &[Section], faults: &[Fault]) -> BackendReport {
        report_with(sections, faults, 1)
    }

    fn report_with(sections: &[Section], faults: &[Fault], permits: u32) -> BackendReport {
        analyse(
            "test",
            &[FaultKind::Pause],
            faults,
            Vec::new(),
            &Log {
                sections: sections.to_vec(),
                waits: Vec::new(),
                counters: Default::default(),
            },
            LEASE,
            &[],
            permits,
            0,
            10_000 * MS,
        )
    }

    fn with_role(mut s: Section, role: Role) -> Section {
        s.role = role;
        s
    }

    #[test]
    fn readers_together_are_no_overlap_but_a_writer_among_them_is() {
        let r = report(
            &[
                with_role(section(0, 1, 100, 300, None), Role::Read),
                with_role(section(1, 2, 150, 350, None), Role::Read),
                with_role(section(2, 3, 320, 400, None), Role::Write),
            ],
            &[],
        );
        assert_eq!(
            r.unannounced_overlaps, 1,
            "only the writer beside the second reader"
        );
    }

    #[test]
    fn more_permit_holders_than_permits_at_once_is_an_over_admission() {
        let permit = |w, f, a, b| with_role(section(w, f, a, b, None), Role::Permit);
        let two = [permit(0, 1, 100, 300), permit(1, 2, 150, 350)];
        assert_eq!(report_with(&two, &[], 2).over_admissions, 0);
        let three = [
            permit(0, 1, 100, 300),
            permit(1, 2, 150, 350),
            permit(2, 3, 200, 250),
        ];
        let r = report_with(&three, &[], 2);
        assert_eq!(r.over_admissions, 1);
        assert_eq!(r.unannounced_overlaps, 0, "permits never overlap pairwise");
        assert!(r.problems().iter().any(|p| p.contains("permits")));
        // Told in time: no over-admission.
        let told = [
            permit(0, 1, 100, 300),
            permit(1, 2, 150, 350),
            with_role(section(2, 3, 200, 250, Some(140)), Role::Permit),
        ];
        assert_eq!(report_with(&told, &[], 2).over_admissions, 0);
    }

    fn pause(worker: usize, start: u64, end: u64) -> Fault {
        Fault {
            kind: FaultKind::Pause,
            worker: Some(worker),
            start: start * MS,
            end: end * MS,
            at_write: false,
            data_loss: false,
        }
    }

    #[test]
    fn sections_at_once_while_neither_was_told_are_an_unannounced_overlap() {
        let r = report(
            &[section(0, 1, 100, 300, None), section(1, 2, 200, 400, None)],
            &[],
        );
        assert_eq!(r.unannounced_overlaps, 1);
        assert_eq!(
            r.max_lost_notice_ms, 100,
            "the holder ran on 100 ms past its successor"
        );
        assert_eq!(r.overlap_details[0].overlap_ms, 100.0);
    }

    #[test]
    fn a_holder_told_before_its_successor_started_is_no_overlap() {
        let r = report(
            &[
                section(0, 1, 100, 300, Some(150)),
                section(1, 2, 200, 400, None),
            ],
            &[],
        );
        assert_eq!(r.unannounced_overlaps, 0);
        assert_eq!(r.max_lost_notice_ms, 0);
    }

    #[test]
    fn a_foreign_overlap_while_the_master_moved_is_counted_apart() {
        let worker = section(0, 1, 100, 300, None);
        let mut foreign = section(1, 0, 200, 250, None);
        foreign.role = Role::Foreign;
        let failover = |start: u64, end: u64| Fault {
            kind: FaultKind::Failover,
            worker: None,
            start: start * MS,
            end: end * MS,
            at_write: false,
            data_loss: false,
        };
        let r = report(&[worker.clone(), foreign.clone()], &[failover(150, 160)]);
        assert_eq!(r.unannounced_overlaps, 0);
        assert_eq!(r.foreign_overlaps_in_failover, 1);
        // Long before the failover it is an overlap like any other.
        let r = report(&[worker, foreign], &[failover(8_000, 8_100)]);
        assert_eq!(r.unannounced_overlaps, 1);
        assert_eq!(r.foreign_overlaps_in_failover, 0);
    }

    #[test]
    fn overlaps_of_a_paused_worker_are_counted_apart() {
        let r = report(
            &[
                section(0, 1, 100, 3000, None),
                section(1, 2, 1500, 1600, None),
            ],
            &[pause(0, 150, 2900)],
        );
        assert_eq!(r.unannounced_overlaps, 0);
        assert_eq!(r.overlaps_with_paused, 1);
        assert_eq!(r.faults["pause"], 1);
    }

    #[test]
    fn a_later_holder_with_a_lower_fence_is_a_fence_regression() {
        let r = report(
            &[section(0, 5, 100, 200, None), section(1, 3, 300, 400, None)],
            &[],
        );
        assert_eq!(r.fence_regressions, 1);
        assert!(r.problems().iter().any(|p| p.contains("fence regression")));
    }

    #[test]
    fn a_fenceless_backend_s_summary_says_so_instead_of_counting_stale_writes() {
        let mut r = report(&[section(0, 1, 100, 200, None)], &[pause(0, 300, 400)]);
        r.stale_writes_accepted = 70;
        assert!(r.summary().contains("stale writes accepted 70"));
        assert!(r.summary().contains("FAILED"));
        r.fencing = false;
        assert!(r.summary().contains("no fences (not promised)"));
        assert!(!r.summary().contains("stale writes"));
        assert!(r.summary().ends_with("-- ok"));
    }

    #[test]
    fn a_long_unexplained_stretch_fails_the_run_only_with_a_limit() {
        // Nobody holds from 200 to 4000 ms while w1 waits: 3.8 s without a fault.
        let mut r = analyse(
            "test",
            &[],
            &[],
            Vec::new(),
            &Log {
                sections: vec![
                    section(0, 1, 100, 200, None),
                    section(1, 2, 4000, 4100, None),
                ],
                waits: vec![Wait {
                    id: SectionId {
                        worker: 1,
                        life: 0,
                        seq: 2,
                    },
                    role: Role::Exclusive,
                    start: 150 * MS,
                    end: Some(4000 * MS),
                    abandoned: false,
                }],
                counters: Default::default(),
            },
            LEASE,
            &[],
            1,
            0,
            10_000 * MS,
        );
        assert_eq!(r.max_unexplained_unavailable_ms, 3800);
        assert!(r.problems().is_empty());
        r.max_unavailable_limit_ms = Some(3000);
        assert!(r.problems()[0].contains("3800 ms without a fault"));
    }

    #[test]
    fn a_supported_fault_never_injected_fails_the_run() {
        let r = report(&[section(0, 1, 100, 200, None)], &[]);
        assert_eq!(r.problems(), vec!["fault pause never injected".to_owned()]);
    }
}
