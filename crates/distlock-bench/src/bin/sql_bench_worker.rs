//! One measuring process for the SQL lock benchmark (`bench/sql/run.sh`), speaking the worker
//! protocol of `worker.py` of the other-backends harness so that its analysis
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
//! `cargo build --release -p distlock-bench --features sql --bin sql_bench_worker`.

use distlock::{LockRegistry, RegistryOptions};
use distlock_bench::{measure_cycles, measure_ops, run_worker, WorkerArgs};
use mysql_async::prelude::Queryable;

fn url(a: &WorkerArgs) -> String {
    let (host, port) = (a.param("host"), a.param("port"));
    // The harness's own INT_LOCK predates Spring's EXPIRED_AFTER column: use a table of its own.
    let spring = if a.recipe == "distlock-spring" {
        "?spring=true&table=dl_int_lock"
    } else {
        ""
    };
    match a.backend.as_str() {
        "pg" => format!(
            "postgres://{}@{host}:{port}/{}{spring}",
            a.param("user"),
            a.param("dbname")
        ),
        "mariadb" => format!(
            "mysql://{}:{}@{host}:{port}/{}{spring}",
            a.param("user"),
            a.param("password"),
            a.param("database")
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

async fn baseline(a: &WorkerArgs) {
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
    let op = async || rtt.op().await;
    measure_ops(op, client_name(a), a.duration, a.proc_id, a.warmup * 10).await;
}

fn client_name(a: &WorkerArgs) -> &'static str {
    match a.backend.as_str() {
        "pg" => "distlock (tokio-postgres 0.7)",
        _ => "distlock (mysql_async 0.37)",
    }
}

async fn cycles(a: &WorkerArgs) {
    distlock_bench::probe::install();
    let mut url = url(a);
    if a.backend == "mariadb" {
        // The harness's server has a password and no TLS, on loopback: the backend refuses to
        // send a password in clear unless told to (the baseline's client does not ask).
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str("allow_insecure_auth=true");
    }
    let backend = distlock::connect(&url).await.expect("connect");
    let reg = LockRegistry::from_backend(backend, RegistryOptions::default()).unwrap();
    measure_cycles(&reg, a, client_name(a), 2).await;
}

fn main() {
    run_worker(
        |a| async move { baseline(&a).await },
        |a| async move { cycles(&a).await },
    );
}
