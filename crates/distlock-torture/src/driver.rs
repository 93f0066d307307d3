//! The driver: for each backend, starts its servers, the checker store, one fault proxy per
//! worker and server, and the worker processes; runs the nemesis; then stops everything and
//! reports.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::testkit::proxy::FaultProxy;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::Instant;

use crate::analysis::{self, BackendReport};
use crate::checker::Checker;
use crate::nemesis;
use crate::proto::{now_ns, Role};
use crate::servers::{Servers, ALL};

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
}

/// Which kind of lock the workers of a run take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// Every worker takes the key's mutex.
    Mutex,
    /// Even worker slots take the write side of the key's read-write lock, odd ones its read
    /// side.
    ReadWrite,
    /// Every worker takes one permit of a semaphore with this many.
    Semaphore(u32),
}

impl LockMode {
    /// The role of worker slot `worker`.
    fn role(self, worker: usize) -> Role {
        match self {
            LockMode::Mutex => Role::Exclusive,
            LockMode::ReadWrite if worker.is_multiple_of(2) => Role::Write,
            LockMode::ReadWrite => Role::Read,
            LockMode::Semaphore(_) => Role::Permit,
        }
    }

    pub(crate) fn permits(self) -> u32 {
        match self {
            LockMode::Semaphore(n) => n,
            _ => 1,
        }
    }

    pub(crate) fn name(self) -> String {
        match self {
            LockMode::Mutex => "mutex".into(),
            LockMode::ReadWrite => "rw".into(),
            LockMode::Semaphore(n) => format!("semaphore({n})"),
        }
    }
}

/// The worker processes of one backend and what stands between them and the servers.
pub(crate) struct Fleet {
    pub(crate) checker: Checker,
    pub(crate) servers: Arc<Servers>,
    checker_addr: SocketAddr,
    backend: String,
    lease: Duration,
    logs: PathBuf,
    lock: LockMode,
    /// Per worker slot: its proxies (one per server), its process and how many it has had.
    slots: Vec<Slot>,
}

struct Slot {
    proxies: Vec<Arc<FaultProxy>>,
    url: String,
    child: Mutex<(Option<Child>, u32)>,
}

impl Fleet {
    pub(crate) fn workers(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn proxies(&self, worker: usize) -> Vec<Arc<FaultProxy>> {
        self.slots[worker].proxies.clone()
    }

    fn spawn(&self, worker: usize, life: u32) -> std::io::Result<Child> {
        let slot = &self.slots[worker];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(
            self.logs
                .join(format!("{}-worker{worker}.log", self.backend)),
        )?;
        Command::new(std::env::current_exe()?)
            .arg("worker")
            .args(["--worker", &worker.to_string()])
            .args(["--life", &life.to_string()])
            .args(["--url", &slot.url])
            .args(["--checker", &self.checker_addr.to_string()])
            .args(["--lease-ms", &self.lease.as_millis().to_string()])
            .args(["--key", "torture-key"])
            .args(["--role", self.lock.role(worker).name()])
            .args(["--permits", &self.lock.permits().to_string()])
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
    }

    fn pid(&self, worker: usize) -> Result<Pid, String> {
        let child = self.slots[worker]
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let c = child.0.as_ref().ok_or("worker not running")?;
        i32::try_from(c.id())
            .map(Pid::from_raw)
            .map_err(|e| e.to_string())
    }

    /// Sends `signal` to the worker's process.
    pub(crate) fn signal(&self, worker: usize, signal: Signal) -> Result<(), String> {
        // A child of ours that has not been reaped.
        kill(self.pid(worker)?, signal).map_err(|e| e.to_string())
    }

    /// `SIGKILL`s the worker, ends its open section at the time of death and starts a new
    /// process in its slot.
    pub(crate) fn kill_and_respawn(&self, worker: usize) -> Result<(), String> {
        let mut child = self.slots[worker]
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(mut c) = child.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.checker.killed(worker, child.1, now_ns());
        child.1 += 1;
        child.0 = Some(self.spawn(worker, child.1).map_err(|e| e.to_string())?);
        Ok(())
    }

    /// Kills every worker (continuing stopped ones first) and ends their open sections.
    fn stop_all(&self) {
        for (i, slot) in self.slots.iter().enumerate() {
            let mut child = slot.child.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut c) = child.0.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            self.checker.killed(i, child.1, now_ns());
        }
    }
}

/// Runs every backend of `opts`, prints and writes the report; non-zero when a backend shows
/// a violation or a supported fault was never injected.
pub(crate) fn main(opts: Options) -> ExitCode {
    let Some(runtime) = crate::runtime("distlock-torture") else {
        return ExitCode::FAILURE;
    };
    let started = std::time::Instant::now();
    let mut reports = Vec::new();
    let mut failed = false;
    for backend in &opts.backends {
        eprintln!("torture: {backend}: starting servers");
        match runtime.block_on(run_backend(backend, &opts)) {
            Ok(report) => {
                let problems = report.problems();
                eprintln!(
                    "torture: {backend} ({}): {} acquisitions, faults {:?}, stale writes accepted {}, \
                     unannounced overlaps {}, max lost notice {} ms{}",
                    report.lock,
                    report.acquisitions,
                    report.faults,
                    report.stale_writes_accepted,
                    report.unannounced_overlaps,
                    report.max_lost_notice_ms,
                    if problems.is_empty() {
                        String::new()
                    } else {
                        format!(" -- FAILED: {}", problems.join("; "))
                    }
                );
                failed |= !problems.is_empty();
                reports.push(serde_json::to_value(&report).unwrap_or_default());
            }
            Err(e) => {
                eprintln!("torture: {backend}: FAILED: {e}");
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
    let mut slots = Vec::new();
    for _ in 0..opts.workers {
        let mut proxies = Vec::new();
        for target in servers.targets() {
            proxies.push(Arc::new(
                FaultProxy::start(target).await.map_err(|e| e.to_string())?,
            ));
        }
        let addrs: Vec<SocketAddr> = proxies.iter().map(|p| p.addr()).collect();
        slots.push(Slot {
            url: servers.worker_url(&addrs, opts.lease),
            proxies,
            child: Mutex::new((None, 0)),
        });
    }
    let fleet = Arc::new(Fleet {
        checker: checker.clone(),
        servers: servers.clone(),
        checker_addr,
        backend: backend.to_owned(),
        lease: opts.lease,
        logs: opts.logs.clone(),
        lock: opts.lock,
        slots,
    });
    // Before the first worker starts: its first section may begin at once.
    let t0 = now_ns();
    for (i, slot) in fleet.slots.iter().enumerate() {
        let child = fleet.spawn(i, 0).map_err(|e| e.to_string())?;
        slot.child.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(child);
    }
    // Faults start once the workers are at work.
    let ready_by = Instant::now() + Duration::from_secs(30);
    while checker.finish(now_ns()).0.is_empty() {
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
    let until = Instant::now() + opts.duration;
    let (faults, fault_errors) =
        nemesis::run(fleet.clone(), kinds.clone(), opts.lease, until, opts.quick).await;
    // A last stretch without faults, so that the system is seen to recover.
    tokio::time::sleep(opts.lease).await;
    let t_end = now_ns();
    fleet.stop_all();
    checker_task.abort();
    let (sections, counters) = checker.finish(t_end);
    let mut report = analysis::analyse(
        backend,
        &kinds,
        &faults,
        fault_errors,
        &sections,
        &counters,
        opts.lease,
        opts.lock.permits(),
        t0,
        t_end,
    );
    report.fencing = servers.fences();
    report.lock = opts.lock.name();
    report.permits = matches!(opts.lock, LockMode::Semaphore(_)).then(|| opts.lock.permits());
    let timeline = opts
        .logs
        .join(format!("{backend}-{}-timeline.txt", opts.lock.name()));
    if let Err(e) = std::fs::write(&timeline, analysis::timeline(&sections, &faults, t0)) {
        eprintln!("torture: cannot write {}: {e}", timeline.display());
    }
    drop(fleet);
    tokio::task::spawn_blocking(move || drop(servers))
        .await
        .map_err(|e| e.to_string())?;
    Ok(report)
}
