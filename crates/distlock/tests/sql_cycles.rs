//! Figures, not checks: an uncontended read-lock cycle beside a mutex cycle on each SQL
//! backend (issue 13's target: a read cycle costs at most 1.2× a mutex cycle). Ignored by
//! default, since timing depends on the machine; run it with
//!
//! ```text
//! cargo test --release -p distlock --all-features --test sql_cycles -- --ignored --nocapture
//! ```
//!
//! Each backend gets a fresh database twice: as the machine keeps it (a temporary SQLite file;
//! a fresh database on the machine's PostgreSQL and MariaDB), where each commit waits for the
//! disk, and without waiting for the disk (the SQLite file in `/dev/shm`; PostgreSQL with
//! `synchronous_commit = off` for that database; a throwaway MariaDB server, which the testkit
//! starts with `innodb_flush_log_at_trx_commit = 2`), which shows the servers' own work. A
//! cycle is one acquisition and its release of one key,
//! the same key again and again, through the backend (`Backend::acquire` + `release`) and
//! through a registry (`try_lock` + `release`). The two kinds take turns, cycle by cycle, so
//! that a neighbour's load falls on both; the figures are the medians of 500 cycles each. It also
//! prints a busy mutex attempt in `Try` mode beside one in `Queue` mode followed by
//! `leave_queue` (what a waiting mutex attempt costs now that these backends claim read-write
//! locks, which makes the registry queue its waiting exclusive attempts).

mod common {
    pub mod sql;
}

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{
    AcquireMode, AcquireRequest, Attempt, Backend, LockKind, LockName, LockRegistry,
    RegistryOptions, Token,
};

/// Cycles of each kind, one of each in turn (in alternating order), so that a neighbour's
/// load falls on both alike.
const CYCLES: usize = 500;

async fn backend_cycle(b: &Arc<dyn Backend>, name: &LockName) -> Duration {
    let started = Instant::now();
    let token = Token::random();
    let request = AcquireRequest::new(name.clone(), token, Duration::from_secs(30));
    let attempt = b.acquire(&request).await.unwrap();
    assert!(matches!(attempt, Attempt::Acquired { .. }), "{attempt:?}");
    assert!(b.release(name, token).await.unwrap().was_held);
    started.elapsed()
}

async fn registry_cycle(reg: &LockRegistry, kind: LockKind) -> Duration {
    let started = Instant::now();
    let guard = match kind {
        LockKind::Read => reg.read_write("cycle").unwrap().read().try_lock().await,
        _ => reg.obtain("cycle").unwrap().try_lock().await,
    };
    guard.unwrap().release().await.unwrap();
    started.elapsed()
}

/// A busy attempt on a key another token holds exclusively, in `mode`; in Queue mode followed
/// (as the registry does when a waiter gives up) by `leave_queue`.
async fn busy_attempt(b: &Arc<dyn Backend>, name: &LockName, mode: AcquireMode) -> Duration {
    let started = Instant::now();
    let token = Token::random();
    let request = AcquireRequest::new(name.clone(), token, Duration::from_secs(30)).with_mode(mode);
    let attempt = b.acquire(&request).await.unwrap();
    assert!(matches!(attempt, Attempt::Busy { .. }), "{attempt:?}");
    if mode == AcquireMode::Queue {
        b.leave_queue(name, token).await.unwrap();
    }
    started.elapsed()
}

/// The medians of `CYCLES` runs of `a` and of `b`, run in turn.
async fn pair<A, B, FA, FB>(mut a: A, mut b: B) -> (Duration, Duration)
where
    A: FnMut() -> FA,
    B: FnMut() -> FB,
    FA: std::future::Future<Output = Duration>,
    FB: std::future::Future<Output = Duration>,
{
    let (mut xs, mut ys) = (Vec::with_capacity(CYCLES), Vec::with_capacity(CYCLES));
    for i in 0..CYCLES {
        if i % 2 == 0 {
            xs.push(a().await);
            ys.push(b().await);
        } else {
            ys.push(b().await);
            xs.push(a().await);
        }
    }
    (median(xs), median(ys))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Prints the median cycle of each kind and their ratio.
async fn compare(label: &str, b: Arc<dyn Backend>) {
    let mutex = LockName::new("cycles", "backend").unwrap();
    let read = mutex.clone().with_kind(LockKind::Read);
    let reg =
        LockRegistry::from_backend(b.clone(), RegistryOptions::default().with_prefix("cycles"))
            .unwrap();
    // Warm up: connections, prepared statements, the rows of both keys.
    for _ in 0..20 {
        backend_cycle(&b, &mutex).await;
        backend_cycle(&b, &read).await;
        registry_cycle(&reg, LockKind::Mutex).await;
        registry_cycle(&reg, LockKind::Read).await;
    }
    let (bm, br) = pair(|| backend_cycle(&b, &mutex), || backend_cycle(&b, &read)).await;
    let (rm, rr) = pair(
        || registry_cycle(&reg, LockKind::Mutex),
        || registry_cycle(&reg, LockKind::Read),
    )
    .await;
    // A waiting mutex attempt: the registry sends Queue mode on these backends.
    let held = LockName::new("cycles", "held").unwrap();
    let holder = Token::random();
    let request = AcquireRequest::new(held.clone(), holder, Duration::from_secs(60));
    assert!(matches!(
        b.acquire(&request).await.unwrap(),
        Attempt::Acquired { .. }
    ));
    let (bt, bq) = pair(
        || busy_attempt(&b, &held, AcquireMode::Try),
        || busy_attempt(&b, &held, AcquireMode::Queue),
    )
    .await;
    b.release(&held, holder).await.unwrap();
    let ratio = |r: Duration, m: Duration| r.as_secs_f64() / m.as_secs_f64();
    println!(
        "{label:<9} backend: mutex {:>7.1} µs, read {:>7.1} µs, read/mutex {:.2} | \
         registry: mutex {:>7.1} µs, read {:>7.1} µs, read/mutex {:.2}",
        us(bm),
        us(br),
        ratio(br, bm),
        us(rm),
        us(rr),
        ratio(rr, rm),
    );
    println!(
        "{:<9} busy mutex attempt: try {:>7.1} µs, queue + leave_queue {:>7.1} µs, ratio {:.2}",
        "",
        us(bt),
        us(bq),
        ratio(bq, bt),
    );
}

async fn sqlite_in(dir: &std::path::Path) -> Arc<dyn Backend> {
    let path = dir.join("cycles.db");
    distlock::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints timing figures; run with --ignored --nocapture"]
async fn read_cycle_beside_mutex_cycle() {
    println!("each commit waits for the disk:");
    let dir = tempfile::tempdir().unwrap();
    compare("sqlite", sqlite_in(dir.path()).await).await;
    let pg = common::sql::pg_db();
    compare("postgres", common::sql::pg(pg.url()).await).await;
    let my = common::sql::my_db();
    compare("mariadb", common::sql::my(my.url()).await).await;

    println!("no commit waits for the disk:");
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    compare("sqlite", sqlite_in(shm.path()).await).await;
    let pg = common::sql::pg_db();
    pg.query(&format!(
        "ALTER DATABASE \"{}\" SET synchronous_commit = off",
        pg.name()
    ))
    .unwrap();
    compare("postgres", common::sql::pg(pg.url()).await).await;
    let server = Arc::new(distlock_testkit::mysql::MariaDbServer::start().expect("mariadb"));
    let my = server.fresh_database().unwrap();
    compare("mariadb", common::sql::my(my.url()).await).await;
}
