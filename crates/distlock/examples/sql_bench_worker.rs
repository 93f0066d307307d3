//! One measuring process for the SQL lock benchmark (`bench/sql/run.sh`), speaking the worker
//! protocol of `../shared/bench/other-backends/worker.py` so that the shared harness's analysis
//! applies unchanged:
//!
//! 1. connect, warm up on a private key, print `{"ev":"ready",...}`;
//! 2. read `start <CLOCK_MONOTONIC ns>` from stdin and wait until then;
//! 3. loop for `--duration` seconds, timestamps in memory only;
//! 4. print `{"ev":"result",...}` and exit 0.
//!
//! Modes: `baseline` (`--op read|write`: `SELECT 1` or `UPDATE bench_rtt SET v = v + 1` through
//! the same client library distlock uses), `S1` (acquire + release), `S2` (acquire, read and
//! write the counter file, release). `--recipe distlock` (native table) or `distlock-spring`
//! (`INT_LOCK`); `--params` is the harness's JSON connection parameters.
//!
//! Needs the `postgres` and `mysql` features:
//! `cargo build --release -p distlock --features postgres,mysql --example sql_bench_worker`.

use std::io::{BufRead, Write};
use std::time::Duration;

use distlock::{LockRegistry, RegistryOptions};
use mysql_async::prelude::Queryable;

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn cpu_s() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The flat JSON object of `--params`: string and number values only.
fn parse_params(json: &str) -> Vec<(String, String)> {
    let body = json.trim().trim_start_matches('{').trim_end_matches('}');
    let mut out = Vec::new();
    for item in body.split(',') {
        if let Some((k, v)) = item.split_once(':') {
            let unq = |s: &str| s.trim().trim_matches('"').to_owned();
            out.push((unq(k), unq(v)));
        }
    }
    out
}

struct Args {
    backend: String,
    params: Vec<(String, String)>,
    mode: String,
    op: String,
    recipe: String,
    key: String,
    duration: f64,
    proc_id: u64,
    counter_file: String,
    warmup: u64,
}

fn args() -> Args {
    let mut a = Args {
        backend: String::new(),
        params: Vec::new(),
        mode: "S1".into(),
        op: "write".into(),
        recipe: "distlock".into(),
        key: "bench-key".into(),
        duration: 5.0,
        proc_id: 0,
        counter_file: String::new(),
        warmup: 50,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--backend" => a.backend = v,
            "--params" => a.params = parse_params(&v),
            "--mode" => a.mode = v,
            "--op" => a.op = v,
            "--recipe" => a.recipe = v,
            "--variant" => {}
            "--key" => a.key = v,
            "--duration" => a.duration = v.parse().expect("--duration"),
            "--proc-id" => a.proc_id = v.parse().expect("--proc-id"),
            "--counter-file" => a.counter_file = v,
            "--warmup" => a.warmup = v.parse().expect("--warmup"),
            other => panic!("unknown flag {other}"),
        }
        i += 2;
    }
    a
}

fn param<'a>(a: &'a Args, k: &str) -> &'a str {
    a.params
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

fn url(a: &Args) -> String {
    let (host, port) = (param(a, "host"), param(a, "port"));
    // The harness's own INT_LOCK predates Spring's EXPIRED_AFTER column: use a table of its own.
    let spring = if a.recipe == "distlock-spring" {
        "?spring=true&table=dl_int_lock"
    } else {
        ""
    };
    match a.backend.as_str() {
        "pg" => format!(
            "postgres://{}@{host}:{port}/{}{spring}",
            param(a, "user"),
            param(a, "dbname")
        ),
        "mariadb" => format!(
            "mysql://{}:{}@{host}:{port}/{}{spring}",
            param(a, "user"),
            param(a, "password"),
            param(a, "database")
        ),
        other => panic!("unknown backend {other}"),
    }
}

fn read_counter(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn write_counter(path: &str, v: u64) {
    std::fs::write(path, v.to_string()).expect("counter file");
}

fn wait_for_start() -> u64 {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
    let mut parts = line.split_whitespace();
    let start = match (parts.next(), parts.next()) {
        (Some("start"), Some(ns)) => ns.parse().unwrap_or_else(|_| mono_ns()),
        _ => mono_ns(),
    };
    while mono_ns() < start {
        let rem = start.saturating_sub(mono_ns());
        if rem > 2_000_000 {
            std::thread::sleep(Duration::from_nanos(rem - 1_000_000));
        }
    }
    mono_ns()
}

fn ready(client: &str) {
    println!(
        r#"{{"ev":"ready","ready_ns":{},"pid":{},"client":"{client}"}}"#,
        mono_ns(),
        std::process::id()
    );
    std::io::stdout().flush().unwrap();
}

enum Rtt {
    Pg(tokio_postgres::Client, tokio_postgres::Statement),
    My(mysql_async::Conn, &'static str),
}

impl Rtt {
    async fn op(&mut self) {
        match self {
            Rtt::Pg(c, s) => {
                c.query(&*s, &[]).await.unwrap();
            }
            Rtt::My(c, q) => c.query_drop(*q).await.unwrap(),
        }
    }
}

async fn baseline(a: &Args) {
    let sql = if a.op == "read" {
        "SELECT 1"
    } else {
        "UPDATE bench_rtt SET v = v + 1 WHERE id = 1"
    };
    let mut rtt = match a.backend.as_str() {
        "pg" => {
            let (c, conn) = tokio_postgres::connect(&url(a), tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let s = c.prepare(sql).await.unwrap();
            Rtt::Pg(c, s)
        }
        _ => {
            let opts = mysql_async::Opts::from_url(&url(a)).unwrap();
            Rtt::My(mysql_async::Conn::new(opts).await.unwrap(), sql)
        }
    };
    for _ in 0..a.warmup * 10 {
        rtt.op().await;
    }
    ready(client_name(a));
    let start = wait_for_start();
    let end = start + (a.duration * 1e9) as u64;
    let cpu0 = cpu_s();
    let mut lat = Vec::with_capacity(200_000);
    let mut now = start;
    while now < end {
        rtt.op().await;
        let t = mono_ns();
        lat.push(t - now);
        now = t;
    }
    let cpu = cpu_s() - cpu0;
    let lat: Vec<String> = lat.iter().map(u64::to_string).collect();
    println!(
        r#"{{"ev":"result","lat_ns":[{}],"ops":{},"start_ns":{start},"finished_ns":{now},"cpu_s":{cpu:.4},"errors":0,"first_error":null,"proc_id":{},"pid":{}}}"#,
        lat.join(","),
        lat.len(),
        a.proc_id,
        std::process::id()
    );
}

fn client_name(a: &Args) -> &'static str {
    match a.backend.as_str() {
        "pg" => "distlock (tokio-postgres 0.7)",
        _ => "distlock (mysql_async 0.37)",
    }
}

async fn cycles(a: &Args) {
    let backend = distlock::connect(&url(a)).await.expect("connect");
    let reg = LockRegistry::from_backend(backend, RegistryOptions::default()).unwrap();
    let warm = reg
        .obtain(&format!("{}:warmup:{}", a.key, a.proc_id))
        .unwrap();
    for _ in 0..a.warmup {
        warm.lock().await.unwrap().release().await.unwrap();
    }
    let lock = reg.obtain(&a.key).unwrap();
    ready(client_name(a));
    let start = wait_for_start();
    let end = start + (a.duration * 1e9) as u64;
    let cpu0 = cpu_s();
    let s2 = a.mode == "S2";
    let mut cycles: Vec<[u64; 4]> = Vec::with_capacity(100_000);
    let (mut errors, mut first_error) = (0u64, None::<String>);
    loop {
        let t0 = mono_ns();
        if t0 >= end {
            break;
        }
        let guard = match lock.lock().await {
            Ok(g) => g,
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("acquire: {e}"));
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        let t1 = mono_ns();
        if s2 {
            write_counter(&a.counter_file, read_counter(&a.counter_file) + 1);
        }
        let t2 = mono_ns();
        if let Err(e) = guard.release().await {
            errors += 1;
            first_error.get_or_insert_with(|| format!("release: {e}"));
        }
        let t3 = mono_ns();
        cycles.push([t0, t1, t2, t3]);
    }
    let cpu = cpu_s() - cpu0;
    let cycles: Vec<String> = cycles
        .iter()
        .map(|c| format!("[{},{},{},{}]", c[0], c[1], c[2], c[3]))
        .collect();
    let first_error = match first_error {
        Some(e) => format!("\"{}\"", e.replace('\\', "\\\\").replace('"', "'")),
        None => "null".into(),
    };
    println!(
        r#"{{"ev":"result","cycles":[{}],"start_ns":{start},"end_ns":{end},"finished_ns":{},"cpu_s":{cpu:.4},"errors":{errors},"first_error":{first_error},"proc_id":{},"pid":{},"extra":{{}},"round_trips":2}}"#,
        cycles.join(","),
        mono_ns(),
        a.proc_id,
        std::process::id()
    );
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if a.mode == "baseline" {
            baseline(&a).await
        } else {
            cycles(&a).await
        }
    });
    std::io::stdout().flush().unwrap();
}
