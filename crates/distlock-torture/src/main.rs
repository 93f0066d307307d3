//! The distlock torture harness (docs/SAFETY.md).
//!
//! `distlock-torture [driver] [--backends LIST] [--duration DUR] [--report FILE] [--quick]
//! [--workers N] [--lease DUR] [--logs DIR] [--parallel N] [--max-unavailable DUR]` runs the
//! driver; `distlock-torture worker ...` is the worker process the driver spawns.
//!
//! The modules depend on each other in one direction: `proto` and `faults` on nothing of the
//! crate; `checker` on `proto`; `servers` on `faults`; `fleet` on those; `nemesis` and
//! `foreign` on `fleet` and `servers`; `liveness` and `analysis` on the records; `driver` on
//! all of them.

mod analysis;
mod checker;
mod driver;
mod faults;
mod fleet;
mod foreign;
mod liveness;
mod nemesis;
mod proto;
mod servers;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Per-backend nemesis time of `--quick`: with server start-up and the final lease, all nine
/// backends fit in about three minutes on two CPUs.
const QUICK_DURATION: Duration = Duration::from_secs(17);
const DEFAULT_DURATION: Duration = Duration::from_secs(60);
const DEFAULT_LEASE: Duration = Duration::from_millis(1500);
/// `--quick` fails a backend whose lock stayed unavailable longer without an explanation.
const QUICK_MAX_UNAVAILABLE: Duration = Duration::from_secs(3);

const USAGE: &str = "usage: distlock-torture [--backends LIST] [--duration DUR] [--report FILE] \
[--quick] [--workers N] [--lease DUR] [--logs DIR] [--lock mutex|rw|semaphore|election] [--parallel N] \
[--max-unavailable DUR]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("worker") => worker::main(&args[1..]),
        Some("driver") => driver_main(&args[1..]),
        _ => driver_main(&args),
    }
}

fn driver_main(args: &[String]) -> ExitCode {
    match parse(args) {
        Ok(opts) => driver::main(opts),
        Err(e) => {
            eprintln!("distlock-torture: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn parse(args: &[String]) -> Result<driver::Options, String> {
    let mut backends: Vec<String> = servers::ALL.iter().map(|s| (*s).to_owned()).collect();
    let mut duration = None;
    let mut report = None;
    let mut quick = false;
    let mut workers = 4;
    let mut lease = DEFAULT_LEASE;
    let mut logs = None;
    let mut lock = "mutex".to_owned();
    let mut parallel = 1;
    let mut max_unavailable = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--backends" => {
                backends = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| match s {
                        "zk" => "zookeeper".to_owned(),
                        "mariadb" => "mysql".to_owned(),
                        other => other.to_owned(),
                    })
                    .collect();
                if let Some(bad) = backends
                    .iter()
                    .find(|b| !servers::ALL.contains(&b.as_str()))
                {
                    return Err(format!(
                        "unknown backend {bad:?} (known: {})",
                        servers::ALL.join(",")
                    ));
                }
            }
            "--duration" => duration = Some(parse_duration(&value()?)?),
            "--report" => report = Some(PathBuf::from(value()?)),
            "--quick" => quick = true,
            "--workers" => {
                workers = value()?
                    .parse()
                    .map_err(|_| "--workers needs a number".to_owned())?;
                if workers < 2 {
                    return Err("--workers must be at least 2".into());
                }
            }
            "--lease" => lease = parse_duration(&value()?)?,
            "--logs" => logs = Some(PathBuf::from(value()?)),
            "--lock" => lock = value()?,
            "--parallel" => {
                parallel = value()?
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| "--parallel needs a number of at least 1".to_owned())?;
            }
            "--max-unavailable" => max_unavailable = Some(parse_duration(&value()?)?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let logs = logs.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("distlock-torture-logs-{}", std::process::id()))
    });
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    let lock = match lock.as_str() {
        "mutex" => fleet::LockMode::Mutex,
        "rw" => fleet::LockMode::ReadWrite,
        // Half the workers at once: permits are contended, and sharing is exercised.
        "semaphore" => fleet::LockMode::Semaphore((workers / 2).max(2) as u32),
        "election" => fleet::LockMode::Election,
        other => {
            return Err(format!(
                "--lock {other:?}: mutex, rw, semaphore or election"
            ))
        }
    };
    Ok(driver::Options {
        lock,
        backends,
        duration: duration.unwrap_or(if quick {
            QUICK_DURATION
        } else {
            DEFAULT_DURATION
        }),
        report,
        quick,
        workers,
        lease,
        logs,
        parallel,
        max_unavailable: max_unavailable.or(quick.then_some(QUICK_MAX_UNAVAILABLE)),
    })
}

/// The library's rule, so `--lease 1.5s` reads as it does for the CLI.
fn parse_duration(s: &str) -> Result<Duration, String> {
    distlock::duration::parse_duration(s).map_err(|e| e.to_string())
}
