//! The lock kinds of one backend side by side (issue 13's targets; `bench/kinds/run.sh` runs it
//! on every backend):
//!
//! 1. **uncontended cycles**: one task, acquire and release back to back, of the key's mutex,
//!    the read and write sides of its read-write lock and a permit of a 4-permit semaphore, in
//!    alternating rounds of `--seconds` (median cycles/s per kind, and read / mutex);
//! 2. **16 tasks** of one registry on one key, with an empty critical section: the mutex (local
//!    hand-overs) beside readers (who share one remote hold); the Redis lock harness's S3 run of
//!    `distlock-read` is the Redis figure with a critical section;
//! 3. **a semaphore of 4 permits and 8 processes** (this program started again as children):
//!    each child takes a permit, marks itself inside with a file, counts the marks (more than 4
//!    is a violation), holds for `--hold-ms` and leaves; the parent reports cycles, the
//!    violations and the shares min/max.
//!
//! ```text
//! cargo run --release -p distlock-bench --features scale,redis --bin kinds_bench -- --spawn redis
//! kinds_bench --backend sqlite:///tmp/k.db --seconds 2 --rounds 3 --json
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{Lock, LockRegistry, RegistryOptions};
use distlock_bench::spawn::{spawn, Target};
use serde::Serialize;

const USAGE: &str = "usage: kinds_bench (--backend URL | --spawn KIND) [--seconds S] [--rounds N] \
                     [--tasks N] [--processes N] [--permits N] [--hold-ms MS] [--json]";

struct Args {
    target: Target,
    seconds: f64,
    rounds: usize,
    tasks: usize,
    processes: usize,
    permits: u32,
    hold_ms: u64,
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        target: Target::default(),
        seconds: 2.0,
        rounds: 3,
        tasks: 16,
        processes: 8,
        permits: 4,
        hold_ms: 5,
    };
    a.target = Target::parse(argv, &format!("\n{USAGE}"), |flag, v| {
        let n = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number"))
        };
        match flag {
            "--seconds" => a.seconds = v.parse().map_err(|_| "--seconds: a number")?,
            "--rounds" => a.rounds = n(v)? as usize,
            "--tasks" => a.tasks = n(v)? as usize,
            "--processes" => a.processes = n(v)? as usize,
            "--permits" => a.permits = n(v)? as u32,
            "--hold-ms" => a.hold_ms = n(v)?,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
        Ok(())
    })?;
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Cycles/s of one task locking and releasing `lock` for `seconds`.
async fn cycles(lock: &Lock, seconds: f64) -> Result<f64, String> {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let mut n = 0u64;
    while Instant::now() < until {
        let g = lock.lock().await.map_err(|e| e.to_string())?;
        g.release().await.map_err(|e| e.to_string())?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Cycles/s of `tasks` tasks of one registry on `lock`, for `seconds`.
async fn concurrent_cycles(lock: &Lock, tasks: usize, seconds: f64) -> Result<f64, String> {
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (lock, count) = (lock.clone(), count.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < until {
                let g = lock.lock().await.map_err(|e| e.to_string())?;
                tokio::task::yield_now().await;
                g.release().await.map_err(|e| e.to_string())?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

#[derive(Serialize)]
struct Report {
    backend: String,
    mutex_cycles_s: f64,
    read_cycles_s: f64,
    write_cycles_s: f64,
    permit_cycles_s: f64,
    /// Read cycle time over mutex cycle time (target: at most 1.2).
    read_cost_vs_mutex: f64,
    tasks: usize,
    mutex_tasks_cycles_s: f64,
    read_tasks_cycles_s: f64,
    processes: usize,
    permits: u32,
    semaphore_cycles: u64,
    semaphore_violations: u64,
    semaphore_most_inside: u64,
    semaphore_share_min_max: f64,
}

async fn run(a: &Args, exe: &Path) -> Result<Report, String> {
    let opts = RegistryOptions::default().with_prefix(format!("kinds{}", std::process::id()));
    let reg = LockRegistry::connect(&a.target.backend, opts)
        .await
        .map_err(|e| e.to_string())?;
    let rw = reg.read_write("rw").map_err(|e| e.to_string())?;
    let sem = reg.semaphore("sem", 4).map_err(|e| e.to_string())?;
    let mutex = reg.obtain("m").map_err(|e| e.to_string())?;
    let kinds: [(&str, &Lock); 4] = [
        ("mutex", &mutex),
        ("read", rw.read()),
        ("write", rw.write()),
        ("permit", &sem),
    ];
    for (_, lock) in kinds {
        cycles(lock, 0.2).await?; // warm-up: connections, scripts, tables
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); 4];
    for _ in 0..a.rounds {
        for (i, (_, lock)) in kinds.iter().enumerate() {
            rates[i].push(cycles(lock, a.seconds).await?);
        }
    }
    let [m, r, w, p]: [f64; 4] = [0, 1, 2, 3].map(|i| median(rates[i].clone()));
    let mut tasks_m = Vec::new();
    let mut tasks_r = Vec::new();
    for _ in 0..a.rounds {
        tasks_m.push(concurrent_cycles(&mutex, a.tasks, a.seconds).await?);
        tasks_r.push(concurrent_cycles(rw.read(), a.tasks, a.seconds).await?);
    }
    // Across processes only where the backend excludes processes (not memory://).
    let (cycles, violations, most, share) = if reg.backend().capabilities().cross_process {
        semaphore_processes(a, exe)?
    } else {
        (0, 0, 0, 0.0)
    };
    Ok(Report {
        backend: a
            .target
            .backend
            .split("://")
            .next()
            .unwrap_or("")
            .to_owned(),
        mutex_cycles_s: m,
        read_cycles_s: r,
        write_cycles_s: w,
        permit_cycles_s: p,
        read_cost_vs_mutex: if r > 0.0 { m / r } else { f64::INFINITY },
        tasks: a.tasks,
        mutex_tasks_cycles_s: median(tasks_m),
        read_tasks_cycles_s: median(tasks_r),
        processes: a.processes,
        permits: a.permits,
        semaphore_cycles: cycles,
        semaphore_violations: violations,
        semaphore_most_inside: most,
        semaphore_share_min_max: share,
    })
}

/// Starts `--processes` children on the semaphore; returns cycles, violations, the most
/// holders seen inside at once, and min/max of the children's cycles.
fn semaphore_processes(a: &Args, exe: &Path) -> Result<(u64, u64, u64, f64), String> {
    let dir = std::env::temp_dir().join(format!("distlock-kinds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let prefix = format!("kindsem{}", std::process::id());
    let start_at = Instant::now() + Duration::from_secs(2);
    let children: Vec<_> = (0..a.processes)
        .map(|i| {
            Command::new(exe)
                .arg("--child")
                .args([&a.target.backend, &prefix, &dir.display().to_string()])
                .args([i.to_string(), a.permits.to_string(), a.hold_ms.to_string()])
                .arg(format!("{}", a.seconds * a.rounds as f64))
                .arg(
                    start_at
                        .duration_since(Instant::now())
                        .as_millis()
                        .to_string(),
                )
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let (mut total, mut violations, mut most) = (0u64, 0u64, 0u64);
    let mut each = Vec::new();
    for c in children {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("a semaphore child failed: {}", out.status));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut f = text
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        let (n, v, m) = (
            f.next().unwrap_or(0),
            f.next().unwrap_or(0),
            f.next().unwrap_or(0),
        );
        total += n;
        violations += v;
        most = most.max(m);
        each.push(n);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let share = match (each.iter().min(), each.iter().max()) {
        (Some(&lo), Some(&hi)) if hi > 0 => lo as f64 / hi as f64,
        _ => 0.0,
    };
    Ok((total, violations, most, share))
}

/// A semaphore child: prints `cycles violations most_inside`.
async fn child(argv: &[String]) -> Result<(), String> {
    let [url, prefix, dir, index, permits, hold_ms, seconds, start_in_ms] = argv else {
        return Err("child: bad arguments".into());
    };
    let num = |s: &String| s.parse::<u64>().map_err(|e| e.to_string());
    let dir = PathBuf::from(dir);
    let reg = LockRegistry::connect(url, RegistryOptions::default().with_prefix(prefix.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let sem = reg
        .semaphore("shared", num(permits)? as u32)
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_millis(num(start_in_ms)?)).await;
    let until = Instant::now() + Duration::from_secs_f64(seconds.parse().map_err(|_| "seconds")?);
    let mine = dir.join(format!("inside-{index}"));
    let (mut n, mut violations, mut most) = (0u64, 0u64, 0u64);
    while Instant::now() < until {
        let g = sem.lock().await.map_err(|e| e.to_string())?;
        std::fs::write(&mine, b"").map_err(|e| e.to_string())?;
        let inside = std::fs::read_dir(&dir).map_err(|e| e.to_string())?.count() as u64;
        most = most.max(inside);
        if inside > num(permits)? {
            violations += 1;
        }
        tokio::time::sleep(Duration::from_millis(num(hold_ms)?)).await;
        std::fs::remove_file(&mine).map_err(|e| e.to_string())?;
        g.release().await.map_err(|e| e.to_string())?;
        n += 1;
    }
    println!("{n} {violations} {most}");
    Ok(())
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    if argv.first().map(String::as_str) == Some("--child") {
        if let Err(e) = rt.block_on(child(&argv[1..])) {
            eprintln!("kinds_bench child: {e}");
            std::process::exit(1);
        }
        return;
    }
    let mut a = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kinds_bench: {e}");
            std::process::exit(2);
        }
    };
    let _server = match a.target.spawn.as_deref().map(spawn) {
        None => None,
        Some(Ok(s)) => {
            a.target.backend = s.url.clone();
            Some(s)
        }
        Some(Err(e)) => {
            eprintln!("kinds_bench: {e}");
            std::process::exit(1);
        }
    };
    let exe = std::env::current_exe().expect("this program's path");
    match rt.block_on(run(&a, &exe)) {
        Ok(r) if a.target.json => println!("{}", serde_json::to_string(&r).unwrap_or_default()),
        Ok(r) => {
            println!("backend {}", r.backend);
            println!(
                "uncontended cycles/s: mutex {:.0}, read {:.0}, write {:.0}, permit {:.0}; read costs {:.2}x a mutex cycle",
                r.mutex_cycles_s, r.read_cycles_s, r.write_cycles_s, r.permit_cycles_s, r.read_cost_vs_mutex
            );
            println!(
                "{} tasks of one registry: mutex {:.0} cycles/s, readers {:.0} cycles/s ({:.1}x)",
                r.tasks,
                r.mutex_tasks_cycles_s,
                r.read_tasks_cycles_s,
                r.read_tasks_cycles_s / r.mutex_tasks_cycles_s.max(1.0)
            );
            println!(
                "semaphore of {} permits, {} processes: {} cycles, most inside at once {}, violations {}, shares min/max {:.2}",
                r.permits, r.processes, r.semaphore_cycles, r.semaphore_most_inside, r.semaphore_violations, r.semaphore_share_min_max
            );
        }
        Err(e) => {
            eprintln!("kinds_bench: {e}");
            std::process::exit(1);
        }
    }
}
