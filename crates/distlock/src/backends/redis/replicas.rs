//! How many replicas must acknowledge a write (`WAIT`) on Sentinel and Cluster: given in the
//! URL (`min_replicas`), or decided from the topology, again whenever it changes.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::resp::Reply;
use super::transport::server_err;
use super::{RedisBackend, KIND};
use crate::error::{Error, Result};

/// While the topology left `WAIT` off, how often a replicated write looks again whether a
/// replica has come (a replica that was down when the master was chosen).
const RECHECK_OFF: Duration = Duration::from_secs(5);

/// The `min_replicas` in force. Without one in the URL it is 1 when the master (on Cluster:
/// every master) has a replica, else 0, decided when the backend connects and, while it is 0,
/// again after each topology change (a new master named by the Sentinels, `+switch-master`;
/// a new slot map) and every [`RECHECK_OFF`]. A connect that leaves `WAIT` off says so in a
/// warning: a failover may then lose acquisitions.
#[derive(Debug)]
pub(super) struct Replicas {
    /// Given in the URL: never changes.
    fixed: Option<u32>,
    current: AtomicU32,
    /// The topology changed since the last decision.
    changed: AtomicBool,
    /// The slot map generation of the last decision (Cluster).
    generation: AtomicU64,
    decided: Mutex<Option<Instant>>,
}

impl Default for Replicas {
    fn default() -> Self {
        Replicas::fixed(0)
    }
}

impl Replicas {
    /// `min_replicas` given (a single server: 0).
    pub(super) fn fixed(n: u32) -> Self {
        Replicas {
            fixed: Some(n),
            current: AtomicU32::new(n),
            changed: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            decided: Mutex::new(None),
        }
    }

    /// `min_replicas` decided from the topology: undecided until [`Self::decide`].
    pub(super) fn automatic() -> Self {
        Replicas {
            fixed: None,
            changed: AtomicBool::new(true),
            ..Replicas::fixed(0)
        }
    }

    /// The number of replicas that must acknowledge a write now.
    pub(super) fn get(&self) -> u32 {
        self.current.load(Ordering::Acquire)
    }

    /// The topology changed (a new master): decide again before the next replicated write.
    pub(super) fn topology_changed(&self) {
        self.changed.store(true, Ordering::Release);
    }

    /// Whether the number is to be decided again, given the slot map `generation` (0 where
    /// there is none).
    pub(super) fn due(&self, generation: u64) -> bool {
        if self.fixed.is_some() || self.get() > 0 {
            return false;
        }
        self.changed.load(Ordering::Acquire)
            || self.generation.load(Ordering::Acquire) != generation
            || self
                .decided
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_none_or(|at| at.elapsed() >= RECHECK_OFF)
    }

    /// Records the decision for the topology of `generation`: `has_replicas` says whether
    /// the master (every master) has a replica now. Once on, `WAIT` stays on: right after a
    /// failover the new master has no replica yet, and writes that fail until one follows it
    /// are safer than writes a second failover could lose.
    pub(super) fn decide(&self, generation: u64, has_replicas: bool, target: &str) {
        if self.fixed.is_some() {
            return;
        }
        self.changed.store(false, Ordering::Release);
        self.generation.store(generation, Ordering::Release);
        let mut decided = self.decided.lock().unwrap_or_else(|e| e.into_inner());
        let first = decided.is_none();
        *decided = Some(Instant::now());
        let before = self
            .current
            .fetch_max(u32::from(has_replicas), Ordering::AcqRel);
        if first && !has_replicas {
            tracing::warn!(
                server = target,
                "redis: no replica to acknowledge writes, WAIT is off (min_replicas 0) until one \
                 is seen: a failover now may lose acquisitions; set min_replicas in the URL to \
                 require one"
            );
        } else if has_replicas && before == 0 && !first {
            tracing::info!(
                server = target,
                "redis: a replica acknowledges writes now, WAIT is on (min_replicas 1)"
            );
        }
    }

    /// The decision could not be made (the master did not answer): the old one stands and is
    /// made again at the next write.
    pub(super) fn undecided(&self) {
        self.changed.store(true, Ordering::Release);
    }
}

impl RedisBackend {
    /// Decides `min_replicas` again if the topology changed since (see [`Replicas`]).
    pub(super) async fn replicas_in_force(&self) -> u32 {
        let generation = self.cluster.as_ref().map_or(0, |c| c.generation());
        if self.replicas.due(generation) {
            match &self.cluster {
                Some(cluster) => {
                    self.replicas.decide(
                        generation,
                        cluster.every_master_has_replicas(),
                        &self.target,
                    );
                }
                None => match connected_replicas(self).await {
                    Ok(n) => self.replicas.decide(0, n > 0, &self.target),
                    Err(e) => {
                        tracing::debug!(error = %e, "redis: replicas not counted; min_replicas unchanged");
                        self.replicas.undecided();
                    }
                },
            }
        }
        self.replicas.get()
    }
}

/// How many replicas the master has now (`INFO replication`).
pub(super) async fn connected_replicas(backend: &RedisBackend) -> Result<u32> {
    match backend.request(&[b"INFO", b"replication"]).await? {
        Reply::Bulk(Some(info)) => Ok(String::from_utf8_lossy(&info)
            .lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)),
        Reply::Error(e) => Err(server_err(e)),
        r => Err(Error::backend(KIND, format!("unexpected INFO reply {r:?}"))),
    }
}
