//! The PostgreSQL backend's connection pool (deadpool's managed pool with the backend's own
//! connect and statements) beside stock deadpool-postgres and bb8, on the same lock cycle (the
//! figure in docs/ARCHITECTURE.md, "The PostgreSQL pool").
//!
//! One cycle takes a free lock and gives it back with exactly the statements and parameters
//! of the PostgreSQL backend (`PostgresBackend::lock_cycle`), one checkout per statement, each
//! statement prepared once per connection. Every pool gets the same size, plain TCP and the
//! cheapest health check (`is_closed` on checkout). `backend` is the whole
//! `Backend::acquire` + `release` path (each operation as its own task) over the backend's
//! pool, for scale. Every task locks a key of its own, so the figures measure pools, not contention.
//! The pools take turns, round after round, and the median round is printed: the machine is
//! shared, and a neighbour's build would otherwise favour whichever pool ran while it slept.
//!
//! ```text
//! cargo run --release -p distlock-bench --features pg-pool --bin pg_pool_bench -- \
//!     [--seconds 3] [--rounds 3] [--tasks 1,4,16] [--pool-size 8]
//! ```
//!
//! It creates a fresh database on the machine's PostgreSQL (or a throwaway server; see
//! `distlock_testkit::postgres`) with `synchronous_commit = off`, and drops it at the end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::backends::postgres::{LockCycle, PostgresBackend};
use distlock::{AcquireRequest, Attempt, Backend, LockName, Token};
use distlock_testkit::postgres::PostgresServer;
use tokio_postgres::{Client, NoTls, Statement};

const LEASE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The backend's pool, through `PostgresBackend::run_lock_cycle`.
    BackendPool,
    Deadpool,
    Bb8,
    Backend,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::BackendPool, Kind::Deadpool, Kind::Bb8, Kind::Backend];

    fn name(self) -> &'static str {
        match self {
            Kind::BackendPool => "backend pool",
            Kind::Deadpool => "deadpool-postgres",
            Kind::Bb8 => "bb8",
            Kind::Backend => "backend acquire+release",
        }
    }
}

struct Options {
    seconds: f64,
    rounds: usize,
    tasks: Vec<usize>,
    pool_size: usize,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        seconds: 3.0,
        rounds: 3,
        tasks: vec![1, 4, 16],
        pool_size: 8,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair
            .get(1)
            .ok_or_else(|| format!("{} needs a value", pair[0]))?;
        let bad = |e: &dyn std::fmt::Display| format!("{} {value}: {e}", pair[0]);
        match pair[0].as_str() {
            "--seconds" => o.seconds = value.parse().map_err(|e| bad(&e))?,
            "--rounds" => o.rounds = value.parse().map_err(|e| bad(&e))?,
            "--pool-size" => o.pool_size = value.parse().map_err(|e| bad(&e))?,
            "--tasks" => {
                o.tasks = value
                    .split(',')
                    .map(|t| t.parse().map_err(|e| bad(&e)))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.rounds == 0 || o.pool_size == 0 || o.tasks.contains(&0) || o.seconds <= 0.0 {
        return Err("rounds, pool size, tasks and seconds must be positive".into());
    }
    Ok(o)
}

/// A connection of the bb8 pool, with the cycle's statements prepared on it (what the
/// backend's pool and deadpool's `prepare_cached` keep per connection).
struct Prepared {
    client: Client,
    existing: Option<Statement>,
    acquire: Statement,
    release: Statement,
}

struct Bb8Manager {
    config: tokio_postgres::Config,
    cycle: LockCycle,
}

impl bb8::ManageConnection for Bb8Manager {
    type Connection = Prepared;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<Prepared, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(connection);
        let existing = match &self.cycle.acquire_existing {
            Some(sql) => Some(client.prepare(sql).await?),
            None => None,
        };
        let acquire = client.prepare(&self.cycle.acquire).await?;
        let release = client.prepare(&self.cycle.release).await?;
        Ok(Prepared {
            client,
            existing,
            acquire,
            release,
        })
    }

    async fn is_valid(&self, _: &mut Prepared) -> Result<(), tokio_postgres::Error> {
        Ok(())
    }

    fn has_broken(&self, conn: &mut Prepared) -> bool {
        conn.client.is_closed()
    }
}

/// The pools under test, all over one database.
struct Pools {
    backend: PostgresBackend,
    deadpool: deadpool_postgres::Pool,
    bb8: bb8::Pool<Bb8Manager>,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

impl Pools {
    /// One cycle on `key` through `kind`; true when the lock was taken and given back.
    async fn cycle(&self, kind: Kind, key: &LockName) -> Result<bool, Failure> {
        let token = Token::random();
        if kind == Kind::Backend {
            let request = AcquireRequest::new(key.clone(), token, LEASE);
            let taken = matches!(
                self.backend.acquire(&request).await?,
                Attempt::Acquired { .. }
            );
            return Ok(taken && self.backend.release(key, token).await?.was_held);
        }
        let cycle = self.backend.lock_cycle(key, token, LEASE)?;
        let (acquire, release) = (cycle.acquire_params(), cycle.release_params());
        Ok(match kind {
            Kind::BackendPool | Kind::Backend => self.backend.run_lock_cycle(&cycle).await?,
            Kind::Deadpool => {
                let mut rows = Vec::new();
                if let Some(sql) = &cycle.acquire_existing {
                    let c = self.deadpool.get().await?;
                    rows = c.query(&c.prepare_cached(sql).await?, &acquire).await?;
                }
                if rows.is_empty() {
                    let c = self.deadpool.get().await?;
                    rows = c
                        .query(&c.prepare_cached(&cycle.acquire).await?, &acquire)
                        .await?;
                }
                let c = self.deadpool.get().await?;
                let st = c.prepare_cached(&cycle.release).await?;
                taken(&rows) && !c.query(&st, &release).await?.is_empty()
            }
            Kind::Bb8 => {
                let mut rows = Vec::new();
                {
                    let c = self.bb8.get().await?;
                    if let Some(st) = &c.existing {
                        rows = c.client.query(st, &acquire).await?;
                    }
                }
                if rows.is_empty() {
                    let c = self.bb8.get().await?;
                    rows = c.client.query(&c.acquire, &acquire).await?;
                }
                let c = self.bb8.get().await?;
                taken(&rows) && !c.client.query(&c.release, &release).await?.is_empty()
            }
        })
    }
}

fn taken(rows: &[tokio_postgres::Row]) -> bool {
    rows.first().is_some_and(|r| r.get::<_, bool>(0))
}

/// Cycles per second of `tasks` tasks looping on keys of their own for `seconds`.
async fn measure(pools: &Arc<Pools>, kind: Kind, tasks: usize, seconds: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (pools, stop, done) = (pools.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let key = LockName::new("pool-bench", &format!("task-{t}")).expect("a valid key");
                while !stop.load(Ordering::Relaxed) {
                    match pools.cycle(kind, &key).await {
                        Ok(true) => done.fetch_add(1, Ordering::Relaxed),
                        Ok(false) => panic!("{}: a free key was not taken", kind.name()),
                        Err(e) => panic!("{}: {e}", kind.name()),
                    };
                }
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let counted = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("a measuring task failed");
    }
    counted as f64 / elapsed
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let o = options().map_err(|e| {
        format!(
            "{e}\nusage: pg_pool_bench [--seconds S] [--rounds N] [--tasks 1,4,16] [--pool-size N]"
        )
    })?;
    let server = PostgresServer::machine_or_start()?;
    let db = server.fresh_database()?;
    // Without a flush per commit: otherwise every pool waits for the disk alike and the
    // figures say nothing about the pools.
    db.query(&format!(
        "ALTER DATABASE \"{}\" SET synchronous_commit = off",
        db.name()
    ))?;
    let url = format!("{}?sslmode=disable&pool_size={}", db.url(), o.pool_size);
    let backend = PostgresBackend::connect(&url).await?;
    let probe = LockName::new("pool-bench", "probe")?;
    // Creates the lease table, which the other pools expect.
    let cycle = backend.lock_cycle(&probe, Token::random(), LEASE)?;
    backend.run_lock_cycle(&cycle).await?;
    let config: tokio_postgres::Config = db.url().parse()?;
    let manager = deadpool_postgres::ManagerConfig {
        recycling_method: deadpool_postgres::RecyclingMethod::Fast,
    };
    let deadpool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::from_config(
        config.clone(),
        NoTls,
        manager,
    ))
    .max_size(o.pool_size)
    .build()?;
    let bb8 = bb8::Pool::builder()
        .max_size(u32::try_from(o.pool_size)?)
        .test_on_check_out(false)
        .build(Bb8Manager { config, cycle })
        .await?;
    let pools = Arc::new(Pools {
        backend,
        deadpool,
        bb8,
    });
    println!(
        "lock cycles/s (median of {} rounds of {} s; pool size {}; tokio multi-thread, {} threads)",
        o.rounds,
        o.seconds,
        o.pool_size,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for &tasks in &o.tasks {
        // A short warm-up fills every pool to this concurrency before it is measured.
        for kind in Kind::ALL {
            measure(&pools, kind, tasks, 0.3).await;
        }
        let mut figures = vec![Vec::new(); Kind::ALL.len()];
        for _ in 0..o.rounds {
            for (i, kind) in Kind::ALL.into_iter().enumerate() {
                figures[i].push(measure(&pools, kind, tasks, o.seconds).await);
            }
        }
        for (kind, f) in Kind::ALL.into_iter().zip(figures) {
            println!("tasks {tasks:>3}  {:<24} {:>8.0}", kind.name(), median(f));
        }
    }
    Ok(())
}
