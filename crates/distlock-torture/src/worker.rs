//! The worker process: takes the lock over and over and does a fenced read-modify-write on the
//! checker store under it, reporting every step with its time.
//!
//! It uses the lock as the docs tell users to: it stops (does not write) once `lost()` has
//! completed or `is_held()` is false, and passes the guard's fence with every read and write.

use std::io;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{Election, Leadership, Lock, LockGuard, LockRegistry, Owner, RegistryOptions};
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::proto::{now_ns, runtime, Reply, Request, Role, SectionId};

/// What the driver tells a worker on its command line.
struct Args {
    worker: usize,
    life: u32,
    url: String,
    checker: String,
    lease: Duration,
    key: String,
    role: Role,
    permits: u32,
    /// Takes the lock again at once after each release, every other [`GREEDY_PHASE`].
    greedy: bool,
}

/// How long a greedy worker's stretches of taking the lock again at once, and of behaving
/// like the others, each last.
const GREEDY_PHASE: u64 = 3_000_000_000;

/// One attempt in this many (outside greedy stretches) is a timed one, `try_lock_for` with a
/// deadline drawn from [`ABANDON_DEADLINE_MS`]: short enough that it often gives up while
/// others hold and wait.
const TIMED_ONE_IN: u32 = 5;
const ABANDON_DEADLINE_MS: std::ops::RangeInclusive<u64> = 20..=250;

fn parse(args: &[String]) -> Result<Args, String> {
    let get = |name: &str| -> Result<String, String> {
        let i = args
            .iter()
            .position(|a| a == name)
            .ok_or(format!("missing {name}"))?;
        args.get(i + 1)
            .cloned()
            .ok_or(format!("{name} needs a value"))
    };
    let num = |s: String| s.parse::<u64>().map_err(|e| e.to_string());
    Ok(Args {
        worker: num(get("--worker")?)? as usize,
        life: num(get("--life")?)? as u32,
        url: get("--url")?,
        checker: get("--checker")?,
        lease: Duration::from_millis(num(get("--lease-ms")?)?),
        key: get("--key")?,
        role: Role::parse(&get("--role")?).ok_or("--role: exclusive, write, read or permit")?,
        permits: num(get("--permits")?)? as u32,
        greedy: get("--greedy").is_ok_and(|g| g == "1"),
    })
}

/// Entry point of `distlock-torture worker ...`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    let args = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("distlock-torture worker: {e}");
            return ExitCode::from(2);
        }
    };
    // `DISTLOCK_TORTURE_TRACE=<filter>` (for instance `distlock=debug`) writes the library's
    // tracing into the worker's log, to read what a worker did in a stretch the report flags.
    if let Ok(filter) = std::env::var("DISTLOCK_TORTURE_TRACE") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(io::stderr)
            .with_ansi(false)
            .init();
    }
    let Some(runtime) = runtime("distlock-torture worker") else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("distlock-torture worker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The request-reply connection to the checker.
struct Checker {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Checker {
    async fn call(&mut self, request: &Request) -> io::Result<Reply> {
        send(&mut self.write, request).await?;
        let line = self
            .lines
            .next_line()
            .await?
            .ok_or_else(|| io::Error::other("the checker closed the connection"))?;
        serde_json::from_str(&line).map_err(io::Error::other)
    }
}

async fn send(write: &mut OwnedWriteHalf, request: &Request) -> io::Result<()> {
    let mut text = serde_json::to_string(request).map_err(io::Error::other)?;
    text.push('\n');
    write.write_all(text.as_bytes()).await
}

async fn connect(addr: &str) -> io::Result<(OwnedReadHalf, OwnedWriteHalf)> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream.into_split())
}

async fn run(args: Args) -> io::Result<()> {
    let (read, write) = connect(&args.checker).await?;
    let mut checker = Checker {
        lines: BufReader::new(read).lines(),
        write,
    };
    // Lost notices go on a connection of their own, so that they are never queued behind a
    // request of the main loop. When the driver goes away this connection ends, and so does
    // the worker, wherever it is waiting.
    let (mut events_read, events_write) = connect(&args.checker).await?;
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        while let Ok(n) = tokio::io::AsyncReadExt::read(&mut events_read, &mut buf).await {
            if n == 0 {
                break;
            }
        }
        std::process::exit(0);
    });
    let events = Arc::new(Mutex::new(events_write));

    let options = RegistryOptions::default()
        .with_prefix("torture")
        .with_lease(args.lease)
        .with_client_id(format!("torture-w{}-{}", args.worker, args.life));
    let registry = loop {
        match LockRegistry::connect(&args.url, options.clone()).await {
            Ok(r) => break r,
            Err(e) => {
                eprintln!("connect: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let lock = match args.role {
        Role::Exclusive => registry.obtain(&args.key).map(Contender::Lock),
        Role::Write => registry
            .read_write(&args.key)
            .map(|rw| Contender::Lock(rw.write().clone())),
        Role::Read => registry
            .read_write(&args.key)
            .map(|rw| Contender::Lock(rw.read().clone())),
        Role::Permit => registry
            .semaphore(&args.key, args.permits)
            .map(Contender::Lock),
        Role::Leader => registry.election(&args.key).and_then(|e| {
            let me = Owner::new(format!("torture-w{}.{}", args.worker, args.life))?;
            Ok(Contender::Candidate(e, me))
        }),
        Role::Foreign => return Err(io::Error::other("a worker is never the foreign client")),
    }
    .map_err(|e| io::Error::other(e.to_string()))?;

    let mut seq = 0;
    loop {
        // Each attempt gets the number of the section it may become; it is a wait from now
        // until it becomes that section or gives up.
        seq += 1;
        let id = SectionId {
            worker: args.worker,
            life: args.life,
            seq,
        };
        let greedy = args.greedy && (now_ns() / GREEDY_PHASE).is_multiple_of(2);
        let t = now_ns();
        let _ = send(
            &mut *events.lock().await,
            &Request::Waiting {
                id,
                t,
                role: args.role,
            },
        )
        .await;
        let deadline = (!greedy && rand::rng().random_ratio(1, TIMED_ONE_IN))
            .then(|| Duration::from_millis(rand::rng().random_range(ABANDON_DEADLINE_MS)));
        let guard = loop {
            let attempt = lock.attempt(deadline).await;
            match attempt {
                Ok(g) => break Some(g),
                Err(distlock::Error::NotAcquired { .. }) if deadline.is_some() => break None,
                // An error is no reason to stop wanting the lock: the wait goes on.
                Err(e) => {
                    eprintln!("lock: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let Some(guard) = guard else {
            let t = now_ns();
            let _ = send(&mut *events.lock().await, &Request::Abandoned { id, t }).await;
            // Away for a while, so that a place the attempt left behind shows.
            let away = Duration::from_millis(rand::rng().random_range(100..=400));
            tokio::time::sleep(away).await;
            continue;
        };
        let t = now_ns();
        let fence = guard.fence();
        // The "work" between read and write, which a lost lock must cut short.
        let work = Duration::from_millis(rand::rng().random_range(20..=200));
        checker
            .call(&Request::Acquired {
                id,
                fence,
                t,
                role: args.role,
                busy_until: t + u64::try_from(work.as_nanos()).unwrap_or(0),
            })
            .await?;
        let lost = guard.lost();
        let lost_events = events.clone();
        let lost_at = Arc::new(AtomicU64::new(0));
        let watcher = tokio::spawn({
            let lost_at = lost_at.clone();
            async move {
                lost.await;
                let t = now_ns();
                lost_at.store(t, Ordering::SeqCst);
                let _ = send(&mut *lost_events.lock().await, &Request::Lost { id, t }).await;
            }
        });

        // Readers read with their fence (the store then refuses writes of older holders);
        // permit holders only occupy their permit.
        let read = if args.role == Role::Permit {
            Reply::default()
        } else {
            checker.call(&Request::Read { id, fence }).await?
        };
        let lost_during_work = tokio::select! {
            () = tokio::time::sleep(work) => false,
            () = guard.lost() => true,
        };
        let wrote = args.role.writes() && !lost_during_work && guard.is_held();
        if wrote {
            // The write in flight: between the last check and the write reaching the store,
            // nothing can stop it (a pause here is what fences are for).
            let _ = send(&mut *events.lock().await, &Request::Writing { id }).await;
            let in_flight = Duration::from_millis(rand::rng().random_range(10..=40));
            tokio::time::sleep(in_flight).await;
            checker
                .call(&Request::Write {
                    id,
                    fence,
                    base: read.value,
                    ubase: read.uvalue,
                })
                .await?;
        }
        let held_after_write = guard.is_held();
        let t = now_ns();
        let lost = Some(lost_at.load(Ordering::SeqCst)).filter(|&l| l != 0);
        checker
            .call(&Request::End {
                id,
                t,
                lost,
                wrote,
                held_after_write,
            })
            .await?;
        watcher.abort();
        if let Err(e) = guard.release().await {
            eprintln!("release: {e}");
        }
        if !greedy {
            let pause = Duration::from_millis(rand::rng().random_range(0..=20));
            tokio::time::sleep(pause).await;
        }
    }
}

/// What a worker contends with: a lock of some kind, or a candidacy in the key's election.
enum Contender {
    Lock(Lock),
    Candidate(Election, Owner),
}

impl Contender {
    /// Waits for the lock or the leadership, at most `deadline` when one is given.
    async fn attempt(&self, deadline: Option<Duration>) -> distlock::Result<LockGuard> {
        match (self, deadline) {
            (Contender::Lock(lock), Some(d)) => lock.try_lock_for(d).await,
            (Contender::Lock(lock), None) => lock.lock().await,
            (Contender::Candidate(e, me), Some(d)) => e
                .campaign_for(me.clone(), d)
                .await
                .map(Leadership::into_guard),
            (Contender::Candidate(e, me), None) => {
                e.campaign(me.clone()).await.map(Leadership::into_guard)
            }
        }
    }
}
