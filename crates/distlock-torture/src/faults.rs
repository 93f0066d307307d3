//! The faults the harness injects, as the nemesis records them and the analysis reads them.

use serde::Serialize;

/// The faults the harness injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FaultKind {
    /// `SIGSTOP` of the holder for longer than the lease, then `SIGCONT`.
    Pause,
    /// `SIGKILL` of the holder; a new worker process takes its place.
    Kill,
    /// `SIGKILL` of a worker that waits while another holds; a new process takes its place.
    WaiterKill,
    /// A worker gives up a timed attempt (`try_lock_for` with a short deadline) while others
    /// wait. The workers do this by themselves; the nemesis only counts it.
    Abandon,
    /// The holder's connections to the backend stop carrying bytes (held, not dropped) for
    /// longer than the lease, then carry on.
    Stall,
    /// The holder's connections to the backend are reset, and new ones refused, for a while.
    Cut,
    /// The server is killed (`SIGKILL`) and started again; Redis comes back empty.
    ServerRestart,
    /// The leader of the 3-node ensemble is killed and started again.
    LeaderKill,
    /// Not injected: the Sentinels moved the master by themselves (a master that missed their
    /// pings under load), seen by the driver's watch. `[start, end]`: from the last time the
    /// old master was named to the first time the new one was.
    Failover,
}

impl FaultKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::Pause => "pause",
            FaultKind::Kill => "kill",
            FaultKind::WaiterKill => "waiter_kill",
            FaultKind::Abandon => "abandon",
            FaultKind::Stall => "stall",
            FaultKind::Cut => "cut",
            FaultKind::ServerRestart => "server_restart",
            FaultKind::LeaderKill => "leader_kill",
            FaultKind::Failover => "failover",
        }
    }

    /// Whether the nemesis aims it at the worker holding the lock.
    pub(crate) fn hits_holder(self) -> bool {
        matches!(
            self,
            FaultKind::Pause | FaultKind::Kill | FaultKind::Stall | FaultKind::Cut
        )
    }
}

/// One injected fault: `[start, end]` is when it was in force (`CLOCK_MONOTONIC` ns).
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) kind: FaultKind,
    /// The worker slot it hit, for faults aimed at one worker.
    pub(crate) worker: Option<usize>,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// For a pause: whether it hit the worker after its last check, with its write on the way.
    pub(crate) at_write: bool,
    /// For a server restart: whether the server came back without its data.
    pub(crate) data_loss: bool,
}
