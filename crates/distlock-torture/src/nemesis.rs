//! The nemesis: injects one fault at a time, at random, for the whole run, and records when
//! each was in force.
//!
//! In quick mode every fault kind the backend supports comes first, once each in random
//! order, so that none is left out of a short run; after that kinds are drawn at random.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use tokio::time::Instant;

use crate::faults::{Fault, FaultKind};
use crate::fleet::{Fleet, LONG_LEASE_SLOT};
use crate::proto::now_ns;

/// Runs faults until `until`; returns what was injected and the errors of faults that could
/// not be injected.
pub(crate) async fn run(
    fleet: Arc<Fleet>,
    kinds: Vec<FaultKind>,
    lease: Duration,
    until: Instant,
    each_first: bool,
) -> (Vec<Fault>, Vec<String>) {
    let mut faults = Vec::new();
    let mut errors = Vec::new();
    let mut queue: Vec<FaultKind> = Vec::new();
    let mut retries = 2 * kinds.len();
    if each_first {
        queue = kinds.clone();
        queue.shuffle(&mut rand::rng());
    }
    let rng_gap = || Duration::from_millis(rand::rng().random_range(200..=800));
    loop {
        tokio::time::sleep(rng_gap()).await;
        // A kind that must come once and could not be injected yet (nobody held the lock when
        // its turn came) may still be, for a while past the run's end.
        let pending = each_first && !queue.is_empty() && Instant::now() < until + OVERTIME;
        if Instant::now() >= until && !pending {
            break;
        }
        let kind = match queue.pop() {
            Some(k) => k,
            None => *kinds.choose(&mut rand::rng()).expect("at least one kind"),
        };
        // The first waiter kill aims at the long lease, where a late grant shows most.
        let long_first = faults
            .iter()
            .all(|f: &Fault| f.kind != FaultKind::WaiterKill);
        match inject(&fleet, kind, lease, long_first).await {
            Ok(fault) => faults.push(fault),
            Err(e) => {
                errors.push(format!("{}: {e}", kind.name()));
                // A kind that must come once is tried again after the others.
                if each_first && retries > 0 {
                    retries -= 1;
                    queue.insert(0, kind);
                }
            }
        }
    }
    (faults, errors)
}

/// How long a quick run's nemesis may go on past the run's end to inject every kind once.
pub(crate) const OVERTIME: Duration = Duration::from_secs(15);

/// How long a worker-level fault lasts: longer than the lease for pauses and stalls (so the
/// lease runs out under them), anything from half to one and a half leases for cuts.
fn hold_for(kind: FaultKind, lease: Duration) -> Duration {
    let mut rng = rand::rng();
    match kind {
        FaultKind::Pause | FaultKind::Stall => lease.mul_f64(rng.random_range(1.3..=2.0)),
        FaultKind::Cut => lease.mul_f64(rng.random_range(0.5..=1.5)),
        _ => Duration::ZERO,
    }
}

/// How long the holder must stay in its section after a waiter kill: the analysis's 100 ms
/// for an attempt in flight, and 50 ms more for the nemesis's own delay.
const KEPT_OUT_MARGIN_NS: u64 = 150_000_000;

/// How long a worker must have waited before the nemesis kills it as a waiter.
const SETTLED_NS: u64 = 500_000_000;

/// A waiting worker, taken right after another worker entered its section: it is then surely
/// waiting (the holder keeps it out for a while yet). With `long`, the slot with the long
/// lease when it waits (a late grant to it would keep the lock longest), else the one that has
/// waited longest (the one the holder's release would hand the lock to).
async fn waiter_to_kill(fleet: &Fleet, lease: Duration, long: bool) -> Option<usize> {
    let give_up = Instant::now() + lease * 3;
    let open = |h| fleet.checker.open_section(h);
    let mut seen = fleet.checker.holder().and_then(open).map(|(id, _)| id);
    let mut fallback = None;
    while Instant::now() < give_up {
        if let Some(h) = fleet.checker.holder() {
            let section = open(h);
            // A fresh section that lasts long enough for the kill to be told apart from one
            // in a hand-over's instant (see the liveness analysis).
            let fresh = section.is_some_and(|(id, busy_until)| {
                Some(id) != seen && busy_until > now_ns() + KEPT_OUT_MARGIN_NS
            });
            seen = section.map(|(id, _)| id);
            // Only a waiter that has waited a while: it has then joined the backend's queue
            // in full (on ZooKeeper, its liveness mark is written; a waiter killed within its
            // first round trips keeps the bound of its session, as docs/GUARANTEES.md says).
            let settled = now_ns().saturating_sub(SETTLED_NS);
            let waiters: Vec<usize> = fleet
                .checker
                .waiters_since(settled)
                .into_iter()
                .filter(|w| *w != h)
                .collect();
            let choice = if long {
                waiters.iter().copied().find(|w| *w == LONG_LEASE_SLOT)
            } else {
                waiters.first().copied()
            };
            if fresh && choice.is_some() {
                return choice;
            }
            fallback = fallback.or(waiters.first().copied());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    fallback
}

async fn inject(
    fleet: &Arc<Fleet>,
    kind: FaultKind,
    lease: Duration,
    long_first: bool,
) -> Result<Fault, String> {
    if kind == FaultKind::WaiterKill {
        let long = long_first || rand::rng().random_bool(0.5);
        let worker = waiter_to_kill(fleet, lease, long)
            .await
            .ok_or("no worker waited while another held")?;
        let start = now_ns();
        fleet.kill_and_respawn(worker)?;
        return Ok(Fault {
            kind,
            at_write: false,
            worker: Some(worker),
            start,
            end: start,
            data_loss: false,
        });
    }
    // Half of the pauses wait for a holder whose write is on its way (past its last check),
    // the case only fences can catch. The long-lease slot is spared: a holder lost for its
    // lease would only keep the lock from everybody for long.
    let spared = Some(LONG_LEASE_SLOT);
    let mut at_write = false;
    if kind == FaultKind::Pause && rand::rng().random_bool(0.5) {
        let give_up = Instant::now() + lease * 2;
        while Instant::now() < give_up && !at_write {
            at_write = fleet.checker.writer_but(spared).is_some();
            if !at_write {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    // Otherwise aim at the holder: that is where faults bite. With nobody holding, a worker
    // fault would hit a waiter of a lock that is unavailable already, and excuse the outage.
    let give_up = Instant::now() + lease * 2;
    let mut holder = None;
    while kind.hits_holder() && holder.is_none() && Instant::now() < give_up {
        holder = fleet.checker.holder_but(spared);
        if holder.is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let worker = fleet
        .checker
        .writer_but(spared)
        .filter(|_| at_write)
        .or(holder);
    let worker = match (kind.hits_holder(), worker) {
        (_, Some(w)) => w,
        (true, None) => return Err("nobody held the lock".into()),
        // Server faults name no worker.
        (false, None) => 0,
    };
    let start = now_ns();
    let mut data_loss = false;
    let mut target = Some(worker);
    match kind {
        FaultKind::Pause => {
            fleet.signal(worker, Signal::SIGSTOP)?;
            tokio::time::sleep(hold_for(kind, lease)).await;
            fleet.signal(worker, Signal::SIGCONT)?;
        }
        FaultKind::Kill => {
            fleet.kill_and_respawn(worker)?;
        }
        FaultKind::Stall => {
            let proxies = fleet.proxies(worker);
            proxies.iter().for_each(|p| p.pause());
            tokio::time::sleep(hold_for(kind, lease)).await;
            proxies.iter().for_each(|p| p.resume());
        }
        FaultKind::Cut => {
            let proxies = fleet.proxies(worker);
            proxies.iter().for_each(|p| p.cut());
            tokio::time::sleep(hold_for(kind, lease)).await;
            proxies.iter().for_each(|p| p.restore());
        }
        FaultKind::ServerRestart => {
            target = None;
            let servers = fleet.servers.clone();
            data_loss = tokio::task::spawn_blocking(move || servers.restart_server())
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        }
        FaultKind::LeaderKill => {
            target = None;
            let servers = fleet.servers.clone();
            tokio::task::spawn_blocking(move || servers.kill_leader())
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        }
        FaultKind::WaiterKill | FaultKind::Abandon | FaultKind::Failover => {
            return Err(format!("{} is not injected this way", kind.name()))
        }
    }
    Ok(Fault {
        kind,
        at_write,
        worker: target,
        start,
        end: now_ns(),
        data_loss,
    })
}

/// Watches, until `stop` is set, which server the Sentinels name master (every 100 ms), and
/// returns each change of master: when the old one was last named, and when the new one was
/// first. Empty for other backends.
pub(crate) async fn watch_failovers(
    fleet: Arc<Fleet>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<(u64, u64)> {
    let mut changes = Vec::new();
    let mut last: Option<(usize, u64)> = None;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let servers = fleet.servers.clone();
        let Ok(Some(master)) = tokio::task::spawn_blocking(move || servers.sentinel_master()).await
        else {
            if last.is_none() && !fleet.servers.has_sentinels() {
                return changes;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let now = now_ns();
        match last {
            Some((old, seen)) if old != master => changes.push((seen, now)),
            _ => {}
        }
        last = Some((master, now));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    changes
}

/// The failovers of `changes` that no leader kill of `faults` covers (from its start to 2 s
/// after its end), as faults.
pub(crate) fn unexplained_failovers(changes: &[(u64, u64)], faults: &[Fault]) -> Vec<Fault> {
    let slack = 2_000_000_000;
    changes
        .iter()
        .filter(|(seen, found)| {
            !faults.iter().any(|f| {
                f.kind == FaultKind::LeaderKill && f.start <= *found && *seen <= f.end + slack
            })
        })
        .map(|&(start, end)| Fault {
            kind: FaultKind::Failover,
            worker: None,
            start,
            end,
            at_write: false,
            data_loss: false,
        })
        .collect()
}
