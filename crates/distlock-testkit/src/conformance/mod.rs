//! The shared behaviour suite: every backend runs the same scenarios, each in a fresh random
//! namespace. Backends differ only through their [`Capabilities`] and the hooks of
//! [`Harness`], never through separate suites.
//!
//! The scenarios are listed once, in [`SCENARIOS`], each with the [`Requirement`] on the
//! backend's capabilities under which it applies. A scenario that does not apply still runs as
//! a test, and passes printing `not applicable: ...`; a missing server fails, never skips.
//!
//! A backend joins the suite with one [`conformance_suite!`](crate::conformance_suite) line.
//! A backend reachable through [`connect`](distlock::connect) gives its URL, which also lets the
//! cross-process scenarios start child processes on it:
//!
//! ```ignore
//! distlock_testkit::conformance_suite!(on_my_backend, || async {
//!     distlock_testkit::conformance::Harness::connect("mine://127.0.0.1:1234")
//! });
//! ```
//!
//! Others give a factory of connections (the cross-process scenarios are then not
//! applicable):
//!
//! ```ignore
//! distlock_testkit::conformance_suite!(on_my_backend, || async {
//!     distlock_testkit::conformance::Harness::new(|| async { Ok(my_backend().await?) })
//! });
//! ```
//!
//! Scenarios panic (assert) on a violation, so they read like the guarantee they check.

mod elections;
mod faults;
mod kinds;
mod owners;
mod processes;
mod scenarios;
mod scheduled;

pub use elections::{dead_leader_is_replaced_within_its_lease, election_has_one_leader_at_a_time};
pub use faults::failed_acquisitions_leave_the_lock_free;
pub use kinds::*;
pub use owners::owners_are_reported;
pub use processes::{
    killed_holders_free_their_share_across_processes, kinds_exclude_each_other_across_processes,
    mutual_exclusion_across_processes, remote_waiters_are_fifo, run_child_if_asked,
    semaphore_admits_its_permits_across_processes,
};
pub use scenarios::*;
pub use scheduled::at_least_keeps_a_quick_job_locked;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use distlock::Error;
use distlock::{Backend, Capabilities, LockName};
use distlock::{LockRegistry, RegistryOptions};

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Factory = Arc<dyn Fn() -> BoxFut<distlock::Result<Arc<dyn Backend>>> + Send + Sync>;
type Deleter = Arc<dyn Fn(LockName) -> BoxFut<()> + Send + Sync>;

/// How the suite reaches one backend: a factory of independent connections (each registry gets
/// its own, like a separate process would), and optional hooks for fault scenarios.
#[derive(Clone)]
pub struct Harness {
    factory: Factory,
    deleter: Option<Deleter>,
    prefix: String,
    keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
    url: Option<String>,
    test_path: Option<String>,
}

impl Harness {
    /// A harness over backends made by `factory`.
    pub fn new<F, Fut>(factory: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = distlock::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        let factory: Factory = Arc::new(move || Box::pin(factory()));
        Harness {
            factory,
            deleter: None,
            prefix: random_prefix(),
            keep: None,
            url: None,
            test_path: None,
        }
    }

    /// A harness over backends reached through [`connect`](distlock::connect)`(url)`. Child
    /// processes of the cross-process scenarios connect with the same URL.
    pub fn connect(url: impl Into<String>) -> Self {
        let url = url.into();
        let u = url.clone();
        let mut h = Harness::new(move || {
            let u = u.clone();
            async move { distlock::connect(&u).await }
        });
        h.url = Some(url);
        h
    }

    /// Adds a hook that deletes a lock on the server whoever holds it, for the lost-signal
    /// scenarios. Without one they use [`Backend::force_release`] on a fresh connection (and
    /// fail where that is unsupported).
    pub fn with_deleter<F, Fut>(mut self, deleter: F) -> Self
    where
        F: Fn(LockName) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.deleter = Some(Arc::new(move |n| Box::pin(deleter(n))));
        self
    }

    /// Keeps `value` (a throwaway server, say) alive as long as the harness.
    pub fn keep_alive(mut self, value: impl std::any::Any + Send + Sync) -> Self {
        self.keep = Some(Arc::new(value));
        self
    }

    /// This harness's namespace, used as every registry's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The URL the backend is reached at, if the harness was made with
    /// [`connect`](Self::connect).
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// Names the test this harness runs in (`module::scenario`, as the test harness lists it),
    /// so that the cross-process scenarios can start this test binary again as a child.
    /// [`conformance_suite!`](crate::conformance_suite) does this.
    #[doc(hidden)]
    pub fn in_test(mut self, module_path: &str, scenario: &str) -> Self {
        // The test binary lists `on_x::scenario`, without the crate's own name.
        let module = module_path.split_once("::").map_or("", |(_, m)| m);
        self.test_path = Some(if module.is_empty() {
            scenario.to_owned()
        } else {
            format!("{module}::{scenario}")
        });
        self
    }

    /// A new backend connection.
    pub async fn backend(&self) -> Arc<dyn Backend> {
        (self.factory)().await.expect("backend connects")
    }

    /// A registry on a new backend connection with default options in this namespace.
    pub async fn registry(&self) -> LockRegistry {
        self.registry_with(RegistryOptions::default()).await
    }

    /// A registry on a new backend connection with `opts` in this namespace.
    pub async fn registry_with(&self, opts: RegistryOptions) -> LockRegistry {
        LockRegistry::from_backend(self.backend().await, opts.with_prefix(self.prefix.clone()))
            .expect("valid options")
    }

    /// A registry whose holds are never renewed, as a crashed process's: they end with
    /// `lease`.
    pub async fn unrenewed_registry(&self, lease: Duration) -> LockRegistry {
        self.registry_with(
            RegistryOptions::default()
                .with_renew(false)
                .with_lease(lease),
        )
        .await
    }

    /// The slowest of a few uncontended acquire-and-release cycles on this backend, measured
    /// now: the unit by which the scenarios' time limits grow on a slow or loaded machine, so
    /// that a limit checks the behaviour (no polling delay, no overrun) rather than the CPU.
    /// The first cycle is not counted: it also opens the registry's connections (on Sentinel,
    /// asking the Sentinels for the master first), which no later step of a scenario repeats.
    async fn cycle_time(&self) -> Duration {
        let reg = self.registry().await;
        let lock = reg.obtain("pace").unwrap();
        lock.try_lock().await.unwrap().release().await.unwrap();
        let mut slowest = Duration::ZERO;
        for _ in 0..5 {
            let started = Instant::now();
            lock.try_lock().await.unwrap().release().await.unwrap();
            slowest = slowest.max(started.elapsed());
        }
        slowest
    }

    /// `base` plus `cycles` of [`cycle_time`](Self::cycle_time).
    async fn limit(&self, base: Duration, cycles: u32) -> Duration {
        base + self.cycle_time().await * cycles
    }

    async fn capabilities(&self) -> Capabilities {
        self.backend().await.capabilities()
    }

    async fn delete(&self, key: &str) -> bool {
        let name = LockName::new(self.prefix.as_str(), key).expect("valid key");
        match &self.deleter {
            Some(d) => {
                d(name).await;
                true
            }
            None => match self.backend().await.force_release(&name).await {
                Ok(deleted) => {
                    assert!(deleted, "force release found no lock to delete");
                    true
                }
                Err(Error::Unsupported { .. }) => false,
                Err(e) => panic!("force release failed: {e}"),
            },
        }
    }
}

fn random_prefix() -> String {
    format!("t{:016x}", rand::random::<u64>())
}

fn short_lease() -> RegistryOptions {
    RegistryOptions::default().with_lease(Duration::from_millis(600))
}

async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: took longer than {limit:?}"))
}

/// What a scenario needs of a backend's [`Capabilities`] to apply.
#[derive(Clone, Copy)]
pub struct Requirement {
    /// What is required, in words (`"fencing"`, ...), for the `not applicable` line.
    pub what: &'static str,
    /// Whether `Capabilities` meet it.
    pub holds: fn(&Capabilities) -> bool,
}

impl std::fmt::Debug for Requirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

/// A registry of the blocking facade on `backend`, in namespace `prefix`; made on a thread
/// outside the runtime (in `spawn_blocking`), as the facade wants.
pub(crate) fn blocking_registry(
    backend: Arc<dyn Backend>,
    prefix: String,
) -> distlock::blocking::LockRegistry {
    distlock::blocking::LockRegistry::from_backend(
        backend,
        RegistryOptions::default().with_prefix(prefix),
    )
    .unwrap()
}

impl Requirement {
    /// Every backend.
    pub const ANY: Requirement = Requirement {
        what: "nothing",
        holds: |_| true,
    };
    /// Holder descriptions ([`Capabilities::owners`]).
    pub const OWNERS: Requirement = Requirement {
        what: "holder descriptions (owners)",
        holds: |c| c.owners,
    };
    /// Fences that may fence writes ([`Capabilities::fences`]).
    pub const FENCING: Requirement = Requirement {
        what: "fencing",
        holds: |c| c.fences(),
    };
    /// A fair wait queue on the server ([`Capabilities::fifo`]).
    pub const FIFO: Requirement = Requirement {
        what: "a fair wait queue (fifo)",
        holds: |c| c.fifo,
    };
    /// Exclusion across OS processes ([`Capabilities::cross_process`]).
    pub const CROSS_PROCESS: Requirement = Requirement {
        what: "exclusion across processes (cross_process)",
        holds: |c| c.cross_process,
    };
    /// Read-write locks ([`Capabilities::read_write`]).
    pub const READ_WRITE: Requirement = Requirement {
        what: "read-write locks (read_write)",
        holds: |c| c.read_write,
    };
    /// Semaphores ([`Capabilities::semaphores`]).
    pub const SEMAPHORES: Requirement = Requirement {
        what: "semaphores (semaphores)",
        holds: |c| c.semaphores,
    };
    /// Read-write locks or semaphores.
    pub const SHARED_KINDS: Requirement = Requirement {
        what: "read-write locks or semaphores",
        holds: |c| c.read_write || c.semaphores,
    };
    /// Read-write locks across OS processes.
    pub const READ_WRITE_ACROSS_PROCESSES: Requirement = Requirement {
        what: "read-write locks across processes",
        holds: |c| c.read_write && c.cross_process,
    };
    /// Semaphores across OS processes.
    pub const SEMAPHORES_ACROSS_PROCESSES: Requirement = Requirement {
        what: "semaphores across processes",
        holds: |c| c.semaphores && c.cross_process,
    };
    /// Read-write locks or semaphores across OS processes.
    pub const SHARED_KINDS_ACROSS_PROCESSES: Requirement = Requirement {
        what: "read-write locks or semaphores across processes",
        holds: |c| (c.read_write || c.semaphores) && c.cross_process,
    };
}

/// A scenario's future.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// One scenario of the suite.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// Its name, which is also its test's name.
    pub name: &'static str,
    /// What it needs of the backend.
    pub requires: Requirement,
    /// Runs it.
    pub run: for<'a> fn(&'a Harness) -> ScenarioFuture<'a>,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .field("requires", &self.requires)
            .finish()
    }
}

/// The one list of scenarios, each with its [`Requirement`]. [`SCENARIOS`] and the tests of
/// [`conformance_suite!`](crate::conformance_suite) are both made from it.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_scenarios {
    ($($then:tt)*) => {
        $crate::__conformance_scenarios_then! { [$($then)*]
            mutual_exclusion_across_registries: ANY,
            try_lock_fails_fast_when_held: ANY,
            try_lock_for_honours_deadline: ANY,
            blocking_lock_waits_for_release: ANY,
            release_is_owner_checked: ANY,
            lease_expiry_frees_lock: ANY,
            renewal_keeps_lock_past_lease: ANY,
            lost_signal_fires_when_key_deleted: ANY,
            lost_signal_fires_when_lease_expires: ANY,
            fencing_is_monotonic: FENCING,
            blocking_facade_is_reentrant: ANY,
            cancelled_acquisitions_leave_nothing_behind: ANY,
            failed_acquisitions_leave_the_lock_free: ANY,
            local_waiters_are_fifo: ANY,
            remote_waiters_are_fifo: FIFO,
            queued_places_count_the_contenders_before: FIFO,
            mutual_exclusion_across_processes: CROSS_PROCESS,
            odd_keys_are_distinct_locks: ANY,
            invalid_input_is_rejected: ANY,
            unused_handles_expire: ANY,
            thousands_of_keys_at_once: ANY,
            readers_share_and_writers_exclude: READ_WRITE,
            read_write_exclusion_across_registries: READ_WRITE,
            waiting_writer_is_not_starved_by_readers: READ_WRITE,
            local_readers_share_one_remote_hold: READ_WRITE,
            crashed_reader_frees_its_share: READ_WRITE,
            semaphore_admits_at_most_its_permits: SEMAPHORES,
            semaphore_try_timed_and_blocking: SEMAPHORES,
            semaphore_holders_must_agree_on_permits: SEMAPHORES,
            crashed_permit_holder_frees_its_permit: SEMAPHORES,
            shared_holds_renew_and_report_loss: SHARED_KINDS,
            cancelled_kind_acquisitions_leave_nothing_behind: SHARED_KINDS,
            fences_increase_across_kinds: FENCING,
            multi_key_lock_is_all_or_nothing: ANY,
            multi_key_locks_do_not_deadlock: ANY,
            inspect_and_list_show_every_kind: ANY,
            owners_are_reported: OWNERS,
            election_has_one_leader_at_a_time: OWNERS,
            dead_leader_is_replaced_within_its_lease: ANY,
            at_least_keeps_a_quick_job_locked: ANY,
            blocking_facade_covers_every_kind: ANY,
            kinds_exclude_each_other_across_processes: READ_WRITE_ACROSS_PROCESSES,
            semaphore_admits_its_permits_across_processes: SEMAPHORES_ACROSS_PROCESSES,
            killed_holders_free_their_share_across_processes: SHARED_KINDS_ACROSS_PROCESSES,
        }
    };
}

/// Hands the list of [`__conformance_scenarios!`] to what asked for it.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_scenarios_then {
    ([table] $($name:ident: $req:ident,)*) => {
        /// Every scenario of the suite, in the order the tests are generated.
        pub const SCENARIOS: &[Scenario] = &[$(
            Scenario {
                name: stringify!($name),
                requires: Requirement::$req,
                run: |h| Box::pin($name(h)),
            },
        )*];
    };
    ([tests $harness:expr] $($name:ident: $req:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if $crate::conformance::run_child_if_asked().await {
                    return;
                }
                let h: $crate::conformance::Harness = ($harness)().await;
                let h = h.in_test(module_path!(), stringify!($name));
                $crate::conformance::run(stringify!($name), &h).await;
            }
        )*
    };
}

__conformance_scenarios!(table);

/// Runs one named scenario of [`SCENARIOS`] on `h` in a fresh namespace (used by
/// [`conformance_suite!`](crate::conformance_suite)). A scenario whose [`Requirement`] the
/// backend's capabilities do not meet passes, printing `not applicable: ...`.
pub async fn run(name: &str, h: &Harness) {
    let scenario = SCENARIOS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scenario {name:?}"));
    let h = Harness {
        prefix: random_prefix(),
        ..h.clone()
    };
    let backend = h.backend().await;
    let caps = backend.capabilities();
    if !(scenario.requires.holds)(&caps) {
        println!(
            "not applicable: {name} needs {}, which the {} backend does not offer ({caps:?})",
            scenario.requires.what,
            backend.kind()
        );
        return;
    }
    drop(backend);
    (scenario.run)(&h).await;
}

/// Expands to one `#[tokio::test]` per scenario of [`SCENARIOS`], in a module named `$name`,
/// each building its harness with `$harness` (an expression returning a future of
/// [`Harness`]). The tests are named `$name::<scenario>`.
#[macro_export]
macro_rules! conformance_suite {
    ($name:ident, $harness:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance_scenarios!(tests $harness);
        }
    };
}
