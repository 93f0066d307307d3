//! What workers and the driver say to each other: one JSON object per line over loopback TCP,
//! and the one clock every process on the machine shares.

use serde::{Deserialize, Serialize};

/// `CLOCK_MONOTONIC` in nanoseconds. The kernel keeps one such clock for the whole machine, so
/// the times workers record are comparable with each other and with the driver's.
pub(crate) fn now_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC exists on Linux");
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}

/// One critical section of one worker process: `worker` is the slot (0..workers), `life` counts
/// the processes that slot has had (a killed worker is respawned with the next number), `seq`
/// counts the sections of that process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct SectionId {
    pub(crate) worker: usize,
    pub(crate) life: u32,
    pub(crate) seq: u64,
}

impl SectionId {
    /// `w<slot>.<life>#<seq>`, or `foreign#<seq>` for the foreign client, as reports and
    /// timelines name sections and waits.
    pub(crate) fn label(self, role: Role) -> String {
        if role == Role::Foreign {
            format!("foreign#{}", self.seq)
        } else {
            format!("w{}.{}#{}", self.worker, self.life, self.seq)
        }
    }
}

/// Nanoseconds as milliseconds with two decimals, for reports.
pub(crate) fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e4).round() / 100.0
}

/// What a worker's sections hold: the key's mutex or the write side of its read-write lock
/// (exclusive: nobody else may be inside), its read side (beside other readers only), or one
/// permit of its semaphore (beside at most permits - 1 others). `Foreign` is the Redis key
/// taken with a plain `SET NX PX` by a client that is not distlock: exclusive, without a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    #[default]
    Exclusive,
    Write,
    Read,
    Permit,
    Foreign,
    /// A candidate of the key's election, leading during its sections: exclusive, fenced by
    /// its term.
    Leader,
}

impl Role {
    /// Whether a section of this role may overlap one of `other`'s.
    pub(crate) fn shares_with(self, other: Role) -> bool {
        matches!(
            (self, other),
            (Role::Read, Role::Read) | (Role::Permit, Role::Permit)
        )
    }

    /// Whether its sections do the fenced read-modify-write (the exclusive roles).
    pub(crate) fn writes(self) -> bool {
        matches!(self, Role::Exclusive | Role::Write | Role::Leader)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Exclusive => "exclusive",
            Role::Write => "write",
            Role::Read => "read",
            Role::Permit => "permit",
            Role::Foreign => "foreign",
            Role::Leader => "leader",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Role> {
        [
            Role::Exclusive,
            Role::Write,
            Role::Read,
            Role::Permit,
            Role::Leader,
        ]
        .into_iter()
        .find(|r| r.name() == s)
    }
}

/// A worker's message to the checker store. Every request gets one [`Reply`] line, except
/// [`Request::Writing`], [`Request::Lost`], [`Request::Waiting`] and [`Request::Abandoned`],
/// which travel on a connection of their own and are never answered.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Request {
    /// An attempt began at `t` (`lock()` or `try_lock_for` was called): the worker waits for
    /// the lock until it gets it, as section `id`, or gives up.
    Waiting {
        id: SectionId,
        t: u64,
        #[serde(default)]
        role: Role,
    },
    /// The timed attempt `id` gave up at `t`, its deadline past.
    Abandoned { id: SectionId, t: u64 },
    /// `lock()` returned a guard with this fence at time `t`.
    Acquired {
        id: SectionId,
        fence: u64,
        t: u64,
        #[serde(default)]
        role: Role,
        /// Until when the worker will stay in the section at least, unless told the lock is
        /// lost (its "work" is drawn before it reports the section).
        #[serde(default)]
        busy_until: u64,
    },
    /// Read both registers; the fenced one remembers `fence` as seen.
    Read { id: SectionId, fence: u64 },
    /// Write `base + 1` to the fenced register with `fence`, and `ubase + 1` to the unfenced one.
    Write {
        id: SectionId,
        fence: u64,
        base: u64,
        ubase: u64,
    },
    /// The last check passed and the write is on its way (sent on the lost-notice
    /// connection, never answered): the moment a pause does most harm.
    Writing { id: SectionId },
    /// The guard's `lost()` completed at `t`.
    Lost { id: SectionId, t: u64 },
    /// The section ended at `t`: the worker does nothing more under this guard.
    End {
        id: SectionId,
        t: u64,
        /// When `lost()` completed, if it had by `t` (also sent as [`Request::Lost`]).
        lost: Option<u64>,
        wrote: bool,
        held_after_write: bool,
    },
}

/// The checker's answer: the registers' values after the request, and for a write whether the
/// fenced register accepted it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Reply {
    pub(crate) value: u64,
    pub(crate) uvalue: u64,
    pub(crate) accepted: bool,
}

/// The two-worker runtime the driver and every worker run on; `None` (said on stderr, as
/// `who`) when the system will not give one.
pub(crate) fn runtime(who: &str) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("{who}: no runtime: {e}");
            None
        }
    }
}
