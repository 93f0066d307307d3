//! The driver: for each backend, starts its servers, the checker store, one fault proxy per
//! worker and server, the worker processes and (on Redis) the foreign client; runs the
//! nemesis; then stops everything and reports. Backends run one after the other, or up to
//! `--parallel` at once.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::analysis::{self, BackendReport, ForeignReport};
use crate::checker::Checker;
use crate::faults::{Fault, FaultKind};
use crate::fleet::{self, Fleet, LockMode};
use crate::proto::{now_ns, runtime, Role};
use crate::servers::{Servers, ALL};
use crate::{foreign, nemesis};

/// The driver's options (see `scripts/torture.sh --help`).
pub(crate) struct Options {
    pub(crate) backends: Vec<String>,
    pub(crate) duration: Duration,
    pub(crate) report: Option<PathBuf>,
    pub(crate) quick: bool,
    pub(crate) workers: usize,
    pub(crate) lease: Duration,
    pub(crate) logs: PathBuf,
    pub(crate) lock: LockMode,
    /// How many backends run at once.
    pub(crate) parallel: usize,
    /// A backend fails when the lock was unavailable longer than this without a fault to
    /// explain it.
    pub(crate) max_unavailable: Option<Duration>,
}

/// Runs every backend of `opts`, prints and writes the report; non-zero when a backend shows
/// a violation, a supported fault was never injected, or the lock stayed unavailable too long.
pub(crate) fn main(opts: Options) -> ExitCode {
    let Some(runtime) = runtime("distlock-torture") else {
        return ExitCode::FAILURE;
    };
    let started = std::time::Instant::now();
    let opts = Arc::new(opts);
    let mut failed = false;
    let mut reports = Vec::new();
    for (backend, result) in runtime.block_on(run_all(opts.clone())) {
        match result {
            Ok(report) => {
                failed |= !report.problems().is_empty();
                reports.push(serde_json::to_value(&report).unwrap_or_default());
            }
            Err(e) => {
                failed = true;
                reports.push(serde_json::json!({ "backend": backend, "error": e }));
            }
        }
    }
    let text = serde_json::to_string_pretty(&reports).unwrap_or_default();
    println!("{text}");
    if let Some(path) = &opts.report {
        if let Err(e) = std::fs::write(path, format!("{text}\n")) {
            eprintln!("torture: cannot write {}: {e}", path.display());
            failed = true;
        }
    }
    eprintln!(
        "torture: {} backend(s) in {:.0} s: {}",
        opts.backends.len(),
        started.elapsed().as_secs_f64(),
        if failed { "FAILED" } else { "ok" }
    );
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Every backend, at most `opts.parallel` at once; the results in the order of
/// `opts.backends`.
async fn run_all(opts: Arc<Options>) -> Vec<(String, Result<BackendReport, String>)> {
    let gate = Arc::new(tokio::sync::Semaphore::new(opts.parallel.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, backend) in opts.backends.iter().enumerate() {
        // Turns are taken here, in order, so that backends start in the order given.
        let Ok(turn) = gate.clone().acquire_owned().await else {
            break;
        };
        let (opts, backend) = (opts.clone(), backend.clone());
        tasks.spawn(async move {
            let _turn = turn;
            eprintln!("torture: {backend}: starting servers");
            let result = run_backend(&backend, &opts).await;
            match &result {
                Ok(report) => eprintln!("torture: {}", report.summary()),
                Err(e) => eprintln!("torture: {backend}: FAILED: {e}"),
            }
            (i, backend, result)
        });
    }
    let mut results = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(r) => results.push(r),
            Err(e) => results.push((usize::MAX, "?".to_owned(), Err(e.to_string()))),
        }
    }
    results.sort_by_key(|(i, _, _)| *i);
    results.into_iter().map(|(_, b, r)| (b, r)).collect()
}

async fn run_backend(backend: &str, opts: &Options) -> Result<BackendReport, String> {
    if !ALL.contains(&backend) {
        return Err(format!("unknown backend (known: {})", ALL.join(", ")));
    }
    let name = backend.to_owned();
    let servers = tokio::task::spawn_blocking(move || Servers::start(&name))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot start the servers: {e}"))?;
    let servers = Arc::new(servers);
    let checker = Checker::default();
    let (checker_addr, checker_task) = checker.serve().await.map_err(|e| e.to_string())?;
    // Before the first worker starts: its first section may begin at once.
    let t0 = now_ns();
    let fleet = Fleet::start(
        backend,
        servers.clone(),
        checker.clone(),
        checker_addr,
        opts.workers,
        opts.lease,
        opts.logs.clone(),
        opts.lock,
    )
    .await?;
    // Faults start once the workers are at work.
    let ready_by = Instant::now() + Duration::from_secs(30);
    while !checker.any_acquired() {
        if Instant::now() > ready_by {
            fleet.stop_all();
            return Err("no worker acquired the lock within 30 s of starting".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "torture: {backend}: workers at work after {} ms; nemesis for {:?}",
        (now_ns() - t0) / 1_000_000,
        opts.duration
    );
    let kinds = servers.faults();
    // The workers give up their timed attempts by themselves: abandons are counted, not
    // injected.
    let injected: Vec<FaultKind> = kinds
        .iter()
        .copied()
        .filter(|k| *k != FaultKind::Abandon)
        .collect();
    let foreign = (servers.has_foreign() && opts.lock == LockMode::Mutex).then(|| {
        tokio::spawn(foreign::run(
            checker.clone(),
            servers.clone(),
            opts.workers,
            opts.lease,
            opts.lease * 8,
        ))
    });
    let until = Instant::now() + opts.duration;
    let stop_watch = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = tokio::spawn(nemesis::watch_failovers(fleet.clone(), stop_watch.clone()));
    let (mut faults, fault_errors) =
        nemesis::run(fleet.clone(), injected, opts.lease, until, opts.quick).await;
    // A last stretch without faults, so that the system is seen to recover.
    tokio::time::sleep(opts.lease).await;
    stop_watch.store(true, std::sync::atomic::Ordering::Release);
    let changes = watch.await.unwrap_or_default();
    let t_end = now_ns();
    if let Some(task) = &foreign {
        task.abort();
    }
    fleet.stop_all();
    checker_task.abort();
    let log = checker.finish(t_end);
    faults.extend(
        log.waits
            .iter()
            .filter(|w| w.abandoned && w.role != Role::Foreign)
            .map(|w| {
                let t = w.end.unwrap_or(w.start);
                Fault {
                    kind: FaultKind::Abandon,
                    worker: Some(w.id.worker),
                    start: t,
                    end: t,
                    at_write: false,
                    data_loss: false,
                }
            }),
    );
    let failovers = nemesis::unexplained_failovers(&changes, &faults);
    faults.extend(failovers);
    faults.sort_by_key(|f| f.start);
    let mut report = analysis::analyse(
        backend,
        &kinds,
        &faults,
        fault_errors,
        &log,
        opts.lease,
        &(0..opts.workers)
            .map(|w| fleet::lease_of(opts.lease, w))
            .collect::<Vec<_>>(),
        opts.lock.permits(),
        t0,
        t_end,
    );
    report.fencing = servers.fences();
    report.lock = opts.lock.name();
    report.permits = matches!(opts.lock, LockMode::Semaphore(_)).then(|| opts.lock.permits());
    report.max_unavailable_limit_ms = opts.max_unavailable.map(|d| d.as_millis() as u64);
    report.foreign = foreign.is_some().then(|| {
        let waits = log.waits.iter().filter(|w| w.role == Role::Foreign);
        ForeignReport {
            attempts: waits.clone().count(),
            served: log
                .sections
                .iter()
                .filter(|s| s.role == Role::Foreign)
                .count(),
            longest_wait_ms: waits
                .map(|w| w.end.unwrap_or(w.start) - w.start)
                .max()
                .unwrap_or(0)
                / 1_000_000,
        }
    });
    let timeline = opts
        .logs
        .join(format!("{backend}-{}-timeline.txt", opts.lock.name()));
    if let Err(e) = std::fs::write(
        &timeline,
        analysis::timeline(&log.sections, &log.waits, &faults, t0),
    ) {
        eprintln!("torture: cannot write {}: {e}", timeline.display());
    }
    drop(fleet);
    tokio::task::spawn_blocking(move || drop(servers))
        .await
        .map_err(|e| e.to_string())?;
    Ok(report)
}
