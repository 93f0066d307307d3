//! Synthetic runs for the liveness rule: which stretches the faults explain and which they
//! do not.

use super::*;
use crate::proto::SectionId;

const MS: u64 = 1_000_000;
const LEASE: Duration = Duration::from_millis(1000);
/// A lost holder explains its lease plus 500 ms, a lost waiter 300 ms, an outage 1 s after
/// its end.
const TEST_BOUNDS: Bounds = Bounds {
    holder: Span::lease_plus(100, 500),
    waiter: Span::ms(300),
    recovery: Span::ms(1000),
    elections_renew_leases: false,
};

fn id(worker: usize, seq: u64) -> SectionId {
    SectionId {
        worker,
        life: 0,
        seq,
    }
}

fn section(worker: usize, seq: u64, start: u64, end: u64) -> Section {
    Section {
        id: id(worker, seq),
        role: Role::Exclusive,
        fence: seq,
        start: start * MS,
        end: Some(end * MS),
        lost: None,
        wrote: true,
        accepted: true,
        held_after_write: true,
    }
}

fn wait(worker: usize, seq: u64, start: u64, end: u64) -> Wait {
    Wait {
        id: id(worker, seq),
        role: Role::Exclusive,
        start: start * MS,
        end: Some(end * MS),
        abandoned: false,
    }
}

fn fault(kind: FaultKind, worker: Option<usize>, start: u64, end: u64) -> Fault {
    Fault {
        kind,
        worker,
        start: start * MS,
        end: end * MS,
        at_write: false,
        data_loss: false,
    }
}

/// A run of the test bounds and lease, analysed from the first acquisition to 10 s.
fn run<'a>(sections: &'a [Section], waits: &'a [Wait], faults: &'a [Fault]) -> Run<'a> {
    Run {
        sections,
        waits,
        faults,
        bounds: TEST_BOUNDS,
        lease: LEASE,
        leases: &[],
        permits: 1,
        // As the harness does: from the first acquisition.
        from: sections[0].start,
        to: 10_000 * MS,
        t0: 0,
    }
}

fn figure(sections: &[Section], waits: &[Wait], faults: &[Fault]) -> Liveness {
    run(sections, waits, faults).analyse()
}

#[test]
fn a_stretch_after_a_killed_holder_within_its_lease_is_explained() {
    // w0 is killed in its section at 300 ms; w1, waiting since 150 ms, gets the lock at
    // 1700 ms: 1.4 s without a holder, within the lease + 500 ms the kill explains.
    let sections = [section(0, 1, 100, 300), section(1, 1, 1700, 1800)];
    let waits = [wait(0, 1, 50, 100), wait(1, 1, 150, 1700)];
    let kill = [fault(FaultKind::Kill, Some(0), 300, 300)];
    let r = figure(&sections, &waits, &kill);
    assert_eq!(r.unavailable_ms, 1400);
    assert_eq!(r.max_unexplained_unavailable_ms, 0);
    // Past the allowance (lease + 500 ms from the kill, to 1800 ms) the rest counts.
    let late = [section(0, 1, 100, 300), section(1, 1, 2100, 2200)];
    let waits = [wait(0, 1, 50, 100), wait(1, 1, 150, 2100)];
    assert_eq!(
        figure(&late, &waits, &kill).max_unexplained_unavailable_ms,
        300
    );
}

#[test]
fn a_stretch_without_a_fault_is_unexplained() {
    let sections = [section(0, 1, 100, 300), section(1, 1, 3600, 3700)];
    let waits = [wait(1, 1, 150, 3600)];
    let r = figure(&sections, &waits, &[]);
    assert_eq!(r.max_unexplained_unavailable_ms, 3300);
    assert_eq!(r.unexplained.len(), 1);
    assert_eq!(r.unexplained[0].before.as_deref(), Some("w0.0#1"));
    assert_eq!(r.unexplained[0].after.as_deref(), Some("w1.0#1"));
}

#[test]
fn nobody_waiting_is_no_unavailability() {
    let sections = [section(0, 1, 100, 300), section(1, 1, 5000, 5100)];
    // w1 came back at 5000 ms and got the lock at once.
    let waits = [wait(1, 1, 5000, 5000)];
    assert_eq!(figure(&sections, &waits, &[]).unavailable_ms, 0);
}

#[test]
fn a_killed_waiter_explains_only_the_waiter_allowance() {
    // w1 waits behind w0 (in its section until 600 ms) and is killed at 200 ms. w0's
    // release at 600 ms then leaves w2 waiting until 2600 ms: the waiter's 300 ms (to 500
    // ms) are long over, so all 2 s count; a holder's allowance would have covered them.
    let sections = [section(0, 1, 100, 600), section(2, 1, 2600, 2700)];
    let waits = [wait(1, 1, 50, 200), wait(2, 1, 120, 2600)];
    let kill = [fault(FaultKind::WaiterKill, Some(1), 200, 200)];
    let r = figure(&sections, &waits, &kill);
    assert_eq!(r.max_unexplained_unavailable_ms, 2000);
    // The same kill in the instant w0 released (w1 may have been taking the lock) is one of
    // a holder: explained up to 200 ms + lease + 500 ms = 1700 ms.
    let sections = [section(0, 1, 100, 250), section(2, 1, 1600, 1700)];
    let waits = [wait(1, 1, 50, 200), wait(2, 1, 120, 1600)];
    assert_eq!(
        figure(&sections, &waits, &kill).max_unexplained_unavailable_ms,
        0
    );
}

#[test]
fn a_waiter_killed_right_after_a_hand_over_to_another_is_a_waiter() {
    // w3 released at 198 ms, w0 holds from 200 to 600 ms; w1 is killed at 202 ms, next to
    // the release, but w0 kept it out: the waiter's 300 ms (to 502 ms), not a holder's.
    let sections = [
        section(3, 1, 100, 198),
        section(0, 1, 200, 600),
        section(2, 1, 2600, 2700),
    ];
    let waits = [wait(1, 1, 50, 202), wait(2, 1, 120, 2600)];
    let kill = [fault(FaultKind::WaiterKill, Some(1), 202, 202)];
    assert_eq!(
        figure(&sections, &waits, &kill).max_unexplained_unavailable_ms,
        2000
    );
}

#[test]
fn faults_on_waiters_of_a_lock_already_stuck_do_not_excuse_it() {
    // The lock is stuck from 300 ms; w2 is paused at 1000 ms and w3 killed at 1200 ms, both
    // waiting: neither caused the outage, so all of 300..3500 ms counts.
    let sections = [section(0, 1, 100, 300), section(1, 1, 3500, 3600)];
    let waits = [wait(1, 1, 150, 3500), wait(3, 1, 160, 1200)];
    let faults = [
        fault(FaultKind::Pause, Some(2), 1000, 2500),
        fault(FaultKind::Kill, Some(3), 1200, 1200),
    ];
    assert_eq!(
        figure(&sections, &waits, &faults).max_unexplained_unavailable_ms,
        3200
    );
    // Within an outage a fault explains, one on a waiter adds its allowance: a server
    // restart from 200 to 400 ms (explained to 1400 ms), then w3 killed at 1200 ms (to
    // 1500 ms).
    // Its allowance still covers what follows the outage: stuck from 300 to 800 ms, w3 killed
    // at 700 ms explains 800..1000 ms, and of the next outage (900..1900 ms) 900 ms count.
    let sections3 = [
        section(0, 1, 100, 300),
        section(1, 1, 800, 900),
        section(2, 1, 1900, 2000),
    ];
    let waits3 = [
        wait(1, 1, 150, 800),
        wait(2, 1, 160, 1900),
        wait(3, 1, 170, 700),
    ];
    let kill = [fault(FaultKind::Kill, Some(3), 700, 700)];
    assert_eq!(
        figure(&sections3, &waits3, &kill).max_unexplained_unavailable_ms,
        900
    );
    let mut faults = faults.to_vec();
    faults[0] = fault(FaultKind::ServerRestart, None, 200, 400);
    assert_eq!(
        figure(&sections, &waits, &faults).max_unexplained_unavailable_ms,
        2000
    );
}

#[test]
fn a_paused_holder_holds_nothing_but_its_pause_explains_its_lease() {
    // w0 is stopped from 200 to 2800 ms inside its section; w1 gets the lock at 1400 ms.
    let sections = [section(0, 1, 100, 3000), section(1, 1, 1400, 1500)];
    let waits = [wait(1, 1, 150, 1400)];
    let pause = [fault(FaultKind::Pause, Some(0), 200, 2800)];
    let r = figure(&sections, &waits, &pause);
    assert_eq!(r.unavailable_ms, 1200);
    assert_eq!(r.max_unexplained_unavailable_ms, 0);
    // Without the pause on record, w0's section would count as held throughout.
    assert_eq!(figure(&sections, &waits, &[]).unavailable_ms, 0);
}

#[test]
fn an_abandoned_attempt_explains_nothing() {
    let sections = [section(0, 1, 100, 300), section(1, 1, 2400, 2500)];
    let waits = [wait(2, 1, 120, 250), wait(1, 1, 150, 2400)];
    let abandon = [fault(FaultKind::Abandon, Some(2), 250, 250)];
    let r = figure(&sections, &waits, &abandon);
    assert_eq!(r.max_unexplained_unavailable_ms, 2100);
    assert!(r.unexplained[0].faults[0].starts_with("abandon of w2"));
}

#[test]
fn a_server_restart_explains_its_outage_and_the_recovery_after_it() {
    let sections = [section(0, 1, 100, 300), section(1, 1, 2400, 2500)];
    let waits = [wait(1, 1, 150, 2400)];
    // Down from 300 to 1200 ms, then 1 s to recover: to 2200 ms.
    let restart = [fault(FaultKind::ServerRestart, None, 300, 1200)];
    let r = figure(&sections, &waits, &restart);
    assert_eq!(r.max_unexplained_unavailable_ms, 200);
}

#[test]
fn a_foreign_client_s_hold_counts_as_held() {
    let mut foreign = section(4, 1, 300, 2000);
    foreign.role = Role::Foreign;
    let sections = [section(0, 1, 100, 300), foreign, section(1, 1, 2050, 2100)];
    let waits = [wait(1, 1, 150, 2050)];
    let r = figure(&sections, &waits, &[]);
    assert_eq!(r.unavailable_ms, 50);
}

#[test]
fn a_semaphore_with_a_free_permit_and_a_waiter_is_unavailable() {
    let permit = |w, seq, a, b| Section {
        role: Role::Permit,
        ..section(w, seq, a, b)
    };
    let sections = [permit(0, 1, 100, 5000), permit(1, 1, 100, 300)];
    let mut w = wait(2, 1, 150, 2000);
    w.role = Role::Permit;
    let run = |permits| {
        Run {
            permits,
            from: 0,
            ..run(&sections, std::slice::from_ref(&w), &[])
        }
        .analyse()
        .max_unexplained_unavailable_ms
    };
    assert_eq!(run(2), 1700, "one of two permits free from 300 to 2000 ms");
    assert_eq!(run(1), 0, "the one permit held throughout");
}

#[test]
fn every_backend_has_its_allowances() {
    for backend in crate::servers::ALL {
        assert_ne!(bounds(backend), NO_ALLOWANCE, "{backend}");
    }
}

#[test]
fn a_worker_s_allowances_count_with_its_own_lease() {
    // w1 asks for 3 s leases: killed in its section at 300 ms, it explains to 3800 ms.
    let sections = [section(1, 1, 100, 300), section(0, 1, 3700, 3800)];
    let waits = [wait(0, 1, 150, 3700)];
    let kill = [fault(FaultKind::Kill, Some(1), 300, 300)];
    let run = |leases: &[Duration]| {
        Run {
            leases,
            from: 0,
            ..run(&sections, &waits, &kill)
        }
        .analyse()
        .max_unexplained_unavailable_ms
    };
    assert_eq!(run(&[LEASE, Duration::from_secs(3)]), 0);
    assert_eq!(
        run(&[]),
        1900,
        "with the run's 1 s lease: explained to 1800 ms only"
    );
}

#[test]
fn an_election_renews_the_lease_of_a_lost_holder_where_the_server_does_so() {
    // w0 is killed holding at 300 ms (explained to 1800 ms); a leader is killed from 1000 to
    // 1500 ms, inside that window. Where elections give every lease a new term (etcd,
    // ZooKeeper), w0's lease runs again from 1500 ms: explained to 3000 ms, so w1's turn at
    // 2900 ms is explained. Elsewhere the election explains only 1 s after it (to 2500 ms).
    let sections = [section(0, 1, 100, 300), section(1, 1, 2900, 3000)];
    let waits = [wait(0, 1, 50, 100), wait(1, 1, 150, 2900)];
    let faults = [
        fault(FaultKind::Kill, Some(0), 300, 300),
        fault(FaultKind::LeaderKill, None, 1000, 1500),
    ];
    let renewing = |elections_renew_leases| Bounds {
        elections_renew_leases,
        ..TEST_BOUNDS
    };
    let unexplained = |renew| {
        Run {
            bounds: renewing(renew),
            ..run(&sections, &waits, &faults)
        }
        .analyse()
        .max_unexplained_unavailable_ms
    };
    assert_eq!(unexplained(true), 0);
    assert_eq!(unexplained(false), 400, "explained to 2500 ms only");
    // An election after the window closed renews nothing: w0's lease was over by then.
    let late = [
        fault(FaultKind::Kill, Some(0), 300, 300),
        fault(FaultKind::LeaderKill, None, 2000, 2100),
    ];
    let sections = [section(0, 1, 100, 300), section(1, 1, 4000, 4100)];
    let waits = [wait(0, 1, 50, 100), wait(1, 1, 150, 4000)];
    let r = Run {
        bounds: renewing(true),
        ..run(&sections, &waits, &late)
    }
    .analyse();
    // Kill to 1800 ms, election 2000 to 3100 ms: 1800-2000 and 3100-4000 unexplained.
    assert_eq!(r.max_unexplained_unavailable_ms, 900);
}
