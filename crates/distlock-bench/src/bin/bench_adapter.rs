//! distlock's adapter for the Redis lock benchmark harness (`$DISTLOCK_PEERS_HARNESS`): speaks
//! its adapter contract (flags in, JSON lines out) so distlock is measured beside other lock
//! libraries in the same run. Registered in `bench/peers.json`; run with `scripts/bench-peers.sh`.
//!
//! `cargo build --release -p distlock-bench --features redis --bin bench_adapter`.

use std::io::Write;
use std::time::Duration;

use distlock::{LockRegistry, RegistryOptions};
use distlock_bench::{mono_ns, write_line, AdapterCycle, AdapterSummary};
use redis::aio::MultiplexedConnection;

struct Args {
    variant: String,
    redis: String,
    scenario: String,
    key: String,
    counter_key: String,
    duration_s: f64,
    max_cycles: u64,
    workers: usize,
    proc_id: u64,
    start_at: Option<u64>,
    ttl_ms: u64,
    warmup: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        variant: "default".into(),
        redis: "redis://127.0.0.1:6379/".into(),
        scenario: "S1".into(),
        key: "bench:lock".into(),
        counter_key: String::new(),
        duration_s: 5.0,
        max_cycles: 0,
        workers: 0,
        proc_id: 0,
        start_at: None,
        ttl_ms: 30_000,
        warmup: 20,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let flag = pair[0].as_str();
        let val = pair
            .get(1)
            .cloned()
            .ok_or_else(|| format!("missing value for {flag}"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag {
            "--variant" => a.variant = val,
            "--redis" => a.redis = val,
            "--scenario" => a.scenario = val,
            "--key" => a.key = val,
            "--counter-key" => a.counter_key = val,
            "--duration" => a.duration_s = val.parse().map_err(|e| format!("{flag}: {e}"))?,
            "--cycles" => a.max_cycles = num(&val)?,
            "--workers" => a.workers = num(&val)? as usize,
            "--proc-id" => a.proc_id = num(&val)?,
            "--start-at" => a.start_at = Some(num(&val)?),
            "--ttl-ms" => a.ttl_ms = num(&val)?,
            "--warmup" => a.warmup = num(&val)?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.counter_key.is_empty() {
        a.counter_key = format!("{}:counter", a.key);
    }
    if a.workers == 0 {
        a.workers = if a.scenario == "S3" { 16 } else { 1 };
    }
    Ok(a)
}

struct WorkerResult {
    recs: Vec<[u64; 4]>,
    errors: u64,
    first_error: Option<String>,
}

async fn critical_section(con: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<()> {
    let v: Option<i64> = redis::cmd("GET").arg(key).query_async(con).await?;
    redis::cmd("SET")
        .arg(key)
        .arg(v.unwrap_or(0) + 1)
        .query_async::<()>(con)
        .await
}

/// The lock a variant takes: `default` the key's mutex, `shared` the read side of its
/// read-write lock (readers share the key, so the harness's overlap check does not apply).
/// `nolock` takes none: its workers run the critical section alone, the most any shared hold
/// could reach in the same client (its rows fail the overlap check, as they must).
fn handle(registry: &LockRegistry, variant: &str, key: &str) -> distlock::Lock {
    match variant {
        "shared" => registry
            .read_write(key)
            .expect("valid key, a backend with read-write locks")
            .read()
            .clone(),
        _ => registry.obtain(key).expect("valid key"),
    }
}

async fn worker(
    registry: LockRegistry,
    mut cs: MultiplexedConnection,
    args: std::sync::Arc<Args>,
    end_ns: u64,
    max_cycles: u64,
) -> WorkerResult {
    let lock = handle(&registry, &args.variant, &args.key);
    let with_cs = args.scenario != "S1";
    let mut r = WorkerResult {
        recs: Vec::with_capacity(1 << 16),
        errors: 0,
        first_error: None,
    };
    loop {
        let t0 = mono_ns();
        if t0 >= end_ns || (max_cycles > 0 && r.recs.len() as u64 >= max_cycles) {
            break;
        }
        let guard = if args.variant == "nolock" {
            None
        } else {
            match lock.lock().await {
                Ok(g) => Some(g),
                Err(e) => {
                    r.errors += 1;
                    r.first_error.get_or_insert(format!("acquire: {e}"));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            }
        };
        let t1 = mono_ns();
        if with_cs {
            if let Err(e) = critical_section(&mut cs, &args.counter_key).await {
                r.errors += 1;
                r.first_error
                    .get_or_insert(format!("critical section: {e}"));
            }
        }
        let t2 = mono_ns();
        if let Some(Err(e)) = match guard {
            Some(g) => Some(g.release().await),
            None => None,
        } {
            r.errors += 1;
            r.first_error.get_or_insert(format!("release: {e}"));
        }
        r.recs.push([t0, t1, t2, mono_ns()]);
    }
    r
}

async fn run(args: Args) -> Result<(), String> {
    let args = std::sync::Arc::new(args);
    let client = redis::Client::open(args.redis.as_str()).map_err(|e| e.to_string())?;
    let cs = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let opts = RegistryOptions::default().with_lease(Duration::from_millis(args.ttl_ms));
    // `sliced`: hold slices of 5 ms (opt-in); the default hands a contended lock to the head
    // of the queue at every release.
    let url = if args.variant == "sliced" {
        let sep = if args.redis.contains('?') { '&' } else { '?' };
        format!("{}{sep}hold_slice=5ms", args.redis)
    } else {
        args.redis.clone()
    };
    let registry = LockRegistry::connect(&url, opts)
        .await
        .map_err(|e| e.to_string())?;
    let warm = handle(
        &registry,
        &args.variant,
        &format!("{}:warmup:{}", args.key, args.proc_id),
    );
    for _ in 0..args.warmup {
        warm.lock()
            .await
            .map_err(|e| e.to_string())?
            .release()
            .await
            .map_err(|e| e.to_string())?;
    }
    let ready_ns = mono_ns();
    let start_ns = match args.start_at {
        Some(s) => {
            if s > ready_ns {
                tokio::time::sleep(Duration::from_nanos(s - ready_ns)).await;
            }
            s.max(ready_ns)
        }
        None => ready_ns,
    };
    let end_ns = start_ns + (args.duration_s * 1e9) as u64;
    let per_worker = if args.max_cycles > 0 {
        args.max_cycles.div_ceil(args.workers as u64)
    } else {
        0
    };
    let handles: Vec<_> = (0..args.workers)
        .map(|_| {
            tokio::spawn(worker(
                registry.clone(),
                cs.clone(),
                args.clone(),
                end_ns,
                per_worker,
            ))
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.map_err(|e| e.to_string())?);
    }
    let finished_ns = mono_ns();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let (mut cycles, mut errors, mut first_error) = (0u64, 0u64, None::<String>);
    for (w, r) in results.iter().enumerate() {
        for t in &r.recs {
            write_line(&mut out, &AdapterCycle::new(w, *t)).map_err(|e| e.to_string())?;
        }
        cycles += r.recs.len() as u64;
        errors += r.errors;
        if first_error.is_none() {
            first_error = r.first_error.clone();
        }
    }
    let wait = if args.variant == "nolock" {
        "no lock: the critical section alone"
    } else if args.variant != "sliced" {
        "local FIFO queue first (bounded local hand-over); remote waiters queue in Redis and \
         every release hands the lock to the first (for what is left of its place; it claims \
         its whole lease with one attempt); jittered PTTL-bounded polling as fallback"
    } else {
        "local FIFO queue first (bounded local hand-over); remote waiters queue in Redis; a \
         holder that takes the lock again at once keeps it for a 5 ms slice (hold_slice=5ms), \
         then its release hands it to the first waiter; jittered PTTL-bounded polling as \
         fallback"
    };
    let lib_version = format!("distlock {}", env!("CARGO_PKG_VERSION"));
    let summary = AdapterSummary {
        ev: "summary",
        lib: "distlock",
        lib_version: &lib_version,
        variant: &args.variant,
        wait_strategy: wait,
        scenario: &args.scenario,
        proc_id: args.proc_id,
        pid: std::process::id(),
        workers: args.workers,
        cycles,
        errors,
        first_error: first_error.as_deref(),
        ready_ns,
        start_ns,
        end_ns,
        finished_ns,
    };
    write_line(&mut out, &summary).map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("distlock-bench-adapter: {e}");
            std::process::exit(2);
        }
    };
    let rt = if args.scenario == "S3" {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let rt = rt.expect("tokio runtime");
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("distlock-bench-adapter: {e}");
        std::process::exit(1);
    }
}
