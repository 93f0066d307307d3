//! The worker processes of one backend, each behind its own fault proxies, and the kind of
//! lock they take.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_testkit::proxy::FaultProxy;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::checker::Checker;
use crate::proto::{now_ns, Role};
use crate::servers::Servers;

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
    /// Every worker campaigns in the key's election and leads during its sections.
    Election,
}

impl LockMode {
    /// The role of worker slot `worker`.
    pub(crate) fn role(self, worker: usize) -> Role {
        match self {
            LockMode::Mutex => Role::Exclusive,
            LockMode::ReadWrite if worker.is_multiple_of(2) => Role::Write,
            LockMode::ReadWrite => Role::Read,
            LockMode::Semaphore(_) => Role::Permit,
            LockMode::Election => Role::Leader,
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
            LockMode::Election => "election".into(),
        }
    }
}

/// The worker slot with the long lease.
pub(crate) const LONG_LEASE_SLOT: usize = 1;

/// How many times the run's lease worker slot [`LONG_LEASE_SLOT`] asks for: a grant that reaches it after it
/// died or stopped waiting then keeps the lock far longer than its place in the line would
/// (which the other workers' short leases would hide).
const LONG_LEASE_FACTOR: u32 = 5;

/// The lease of worker slot `worker` in a run with lease `lease`.
pub(crate) fn lease_of(lease: Duration, worker: usize) -> Duration {
    if worker == LONG_LEASE_SLOT {
        lease * LONG_LEASE_FACTOR
    } else {
        lease
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
    /// Puts proxies in front of every server for each of `workers` slots and spawns the
    /// workers.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn start(
        backend: &str,
        servers: Arc<Servers>,
        checker: Checker,
        checker_addr: SocketAddr,
        workers: usize,
        lease: Duration,
        logs: PathBuf,
        lock: LockMode,
    ) -> Result<Arc<Fleet>, String> {
        let mut slots = Vec::new();
        for _ in 0..workers {
            let mut proxies = Vec::new();
            for target in servers.targets() {
                proxies.push(Arc::new(
                    FaultProxy::start(target).await.map_err(|e| e.to_string())?,
                ));
            }
            let addrs: Vec<SocketAddr> = proxies.iter().map(|p| p.addr()).collect();
            slots.push(Slot {
                url: servers.worker_url(&addrs, lease),
                proxies,
                child: Mutex::new((None, 0)),
            });
        }
        let fleet = Arc::new(Fleet {
            checker,
            servers,
            checker_addr,
            backend: backend.to_owned(),
            lease,
            logs,
            lock,
            slots,
        });
        for (i, slot) in fleet.slots.iter().enumerate() {
            let child = fleet.spawn(i, 0).map_err(|e| e.to_string())?;
            slot.child.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(child);
        }
        Ok(fleet)
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
            .args([
                "--lease-ms",
                &lease_of(self.lease, worker).as_millis().to_string(),
            ])
            .args(["--key", "torture-key"])
            .args(["--role", self.lock.role(worker).name()])
            .args(["--permits", &self.lock.permits().to_string()])
            // One worker takes the lock again at once after its releases, every other
            // stretch of the run: hold slices and local hand-overs.
            .args(["--greedy", if worker == 0 { "1" } else { "0" }])
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
    pub(crate) fn stop_all(&self) {
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
