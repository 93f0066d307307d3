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

use std::io::Write;

#[path = "support/worker.rs"]
mod worker;
use worker::{measure_cycles, parse_params, OpTimer};

use distlock::{LockRegistry, RegistryOptions};
use mysql_async::prelude::Queryable;

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
    let mut timer = OpTimer::start(client_name(a), a.duration);
    while timer.running() {
        rtt.op().await;
        timer.tick();
    }
    timer.finish(a.proc_id);
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
    let counter = (a.mode == "S2").then_some(a.counter_file.as_str());
    measure_cycles(&lock, client_name(a), a.duration, a.proc_id, counter, 2).await;
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
