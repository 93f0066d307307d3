//! Mutual exclusion between `distlock` processes on each server backend: Redis, ZooKeeper, PostgreSQL, MySQL, etcd (also over TLS).

mod common;

use std::time::Duration;

use common::*;
use distlock_testkit::redis::RedisServer;

#[test]
fn redis_mutual_exclusion() {
    let server = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let url = server.url();
    let home = Home::new();
    let (holder, fence) = home.hold(&["--backend", &url], "rk", &[]);
    assert_eq!(
        server.cli(&["EXISTS", "lock:rk"]).unwrap(),
        "1",
        "Spring-compatible key"
    );

    assert_busy(&home, &url, "rk", "redis", fence);
    stop_holder(holder);
    assert_eq!(
        server.cli(&["EXISTS", "lock:rk"]).unwrap(),
        "0",
        "released on the server"
    );
    let out = home.run(&[
        "--backend",
        &url,
        "run",
        "--key",
        "rk",
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

/// `zk://` across processes: Curator's layout on the server, busy runs exit 75, `status` sees
/// the holder's fence, concurrent waiting runs never overlap, and SIGTERM releases.
#[test]
fn zookeeper_mutual_exclusion_across_processes() {
    use distlock_testkit::zookeeper::ZooKeeperServer;
    let server = ZooKeeperServer::start().expect("ZooKeeper (apt-get install zookeeper)");
    let url = server.url();
    let home = Home::new();
    let (holder, fence) = home.hold(&["--backend", &url], "zk", &[]);
    let dump = server.four_letter("dump").unwrap();
    assert!(dump.contains("/lock/zk/_c_"), "Curator layout: {dump}");

    assert_busy(&home, &url, "zk", "zookeeper", fence);

    let procs = exclusive_runs(
        &home,
        &["--backend", &url],
        "zk",
        &[],
        r#"mkdir "$1" || exit 99; sleep 0.1; rmdir "$1"; printf %s "$DISTLOCK_FENCE""#,
        4,
    );
    std::thread::sleep(Duration::from_millis(300));
    stop_holder(holder);
    for p in procs {
        let out = p.wait(TIMEOUT);
        assert_eq!(out.code, Some(0), "overlap or failure: {out:?}");
        let next: u64 = out.stdout.parse().expect("fence");
        assert!(
            next > fence,
            "fence {next} not above the first holder's {fence}"
        );
    }
    let status = home.run(&["--backend", &url, "status", "zk"]);
    assert_eq!(status.code, Some(3), "free at the end: {status:?}");
}

/// On ZooKeeper `--write` is Curator's read-write lock's write side (a `__WRIT__` node, which
/// Curator's readers wait for), not the mutex (a `lock-` node, which they ignore).
#[test]
fn zookeeper_write_is_the_read_write_locks_write_side() {
    use distlock_testkit::zookeeper::ZooKeeperServer;
    let server = ZooKeeperServer::start().expect("ZooKeeper (apt-get install zookeeper)");
    let url = server.url();
    let home = Home::new();
    let (writer, _) = home.hold(&["--backend", &url], "w", &["--write"]);
    let dump = server.four_letter("dump").unwrap();
    let nodes: Vec<&str> = dump.lines().filter(|l| l.contains("/lock/w/")).collect();
    assert_eq!(nodes.len(), 1, "one contender node: {dump}");
    assert!(
        nodes[0].contains("/lock/w/_c_") && nodes[0].contains("-__WRIT__"),
        "Curator's writer layout: {dump}"
    );
    let status = home.run(&["--backend", &url, "status", "w", "--json"]);
    assert_eq!(
        json_field(status.stdout.trim(), "kind"),
        "\"write\"",
        "{status:?}"
    );
    stop_holder(writer);
    // The default stays the mutex.
    let (mutex, _) = home.hold(&["--backend", &url], "m", &[]);
    let dump = server.four_letter("dump").unwrap();
    assert!(
        dump.lines()
            .any(|l| l.contains("/lock/m/_c_") && l.contains("-lock-")),
        "Curator's mutex layout: {dump}"
    );
    stop_holder(mutex);
}

#[test]
fn redis_prefix_names_the_key() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let home = Home::new();
    let (holder, _) = home.hold(&["--backend", &url, "--prefix", "billing"], "v", &[]);
    assert_eq!(server.cli(&["EXISTS", "billing:v"]).unwrap(), "1");
    drop(holder);
}

/// Mutual exclusion between `distlock` processes through a SQL server: a holder, a `--no-wait`
/// run that gets 75, `status` with the fence, release on SIGTERM, then four waiting runs that
/// never overlap. `rows` counts the live rows of the lease table.
fn sql_mutual_exclusion(url: &str, kind: &str, rows: impl Fn() -> usize) {
    let home = Home::new();
    let (holder, fence) = home.hold(&["--backend", url], "sk", &[]);
    assert_eq!(rows(), 1, "the lock is a row of the lease table");
    assert_busy(&home, url, "sk", kind, fence);
    stop_holder(holder);
    assert_eq!(rows(), 0, "released on the server");
    let status = home.run(&["--backend", url, "status", "sk"]);
    assert_eq!(status.code, Some(3), "{status:?}");

    let procs = exclusive_runs(
        &home,
        &["--backend", url],
        "sk",
        &["--wait", "15s"],
        r#"mkdir "$1" || exit 99; sleep 0.2; rmdir "$1""#,
        4,
    );
    for p in procs {
        let out = p.wait(TIMEOUT);
        assert_eq!(out.code, Some(0), "overlap or failure: {out:?}");
    }
}

#[test]
fn postgres_mutual_exclusion() {
    let db = fresh_postgres();
    let url = format!("{}?table=cli_locks", db.url());
    sql_mutual_exclusion(&url, "postgres", || {
        first_number(db.query("SELECT count(*) FROM cli_locks WHERE token IS NOT NULL"))
    });
}

#[test]
fn mysql_mutual_exclusion() {
    let db = fresh_mariadb();
    sql_mutual_exclusion(db.url(), "mysql", || {
        first_number(db.query("SELECT COUNT(*) FROM distlock_locks WHERE token IS NOT NULL"))
    });
}

/// How many holders of key `sk` etcd keeps (the `concurrency.Mutex` layout's keys).
fn etcd_holders(server: &distlock_testkit::etcd::EtcdServer) -> usize {
    server
        .etcdctl(&["get", "--prefix", "lock/sk/", "--keys-only"])
        .expect("etcdctl get")
        .lines()
        .filter(|l| l.starts_with("lock/sk/"))
        .count()
}

/// `etcd://` across processes: the `concurrency.Mutex` layout on the server (`lock/sk/<lease>`),
/// a busy run exits 75, `status` sees the holder's fence, SIGTERM releases, and waiting runs
/// never overlap.
#[test]
fn etcd_mutual_exclusion() {
    use distlock_testkit::etcd::EtcdServer;
    let server = EtcdServer::start().expect("etcd (apt-get install etcd-server)");
    sql_mutual_exclusion(&server.url(), "etcd", || etcd_holders(&server));
}

/// `etcds://` from the command line: the same as [`etcd_mutual_exclusion`] over TLS, with the
/// server's private authority named by `ca_file`; without it the server is not trusted.
#[test]
fn etcds_mutual_exclusion() {
    use distlock_testkit::etcd::EtcdServer;
    let certs = distlock_testkit::tls::TestCa::new(&["localhost", "127.0.0.1"], "distlock")
        .expect("test CA");
    let d = certs.dir();
    let server =
        EtcdServer::start_tls(&certs).expect("etcd with TLS (apt-get install etcd-server)");
    assert!(server.url().starts_with("etcds://"), "{}", server.url());

    let home = Home::new();
    let untrusted = home.run(&["--backend", &server.url(), "status", "sk"]);
    assert_eq!(untrusted.code, Some(1), "{untrusted:?}");
    assert_eq!(untrusted.stderr.trim().lines().count(), 1, "{untrusted:?}");

    let url = format!("{}?ca_file={}", server.url(), d.join("ca.crt").display());
    sql_mutual_exclusion(&url, "etcd", || etcd_holders(&server));
}

/// A ZooKeeper server with `tickTime=1000` and its default session bounds grants no session
/// longer than 20 s: a `run` without `--lease` takes that (and says so with `-v`), while an
/// explicit `--lease 30s` it cannot grant stays a configuration error.
#[test]
fn zookeeper_run_without_a_lease_takes_the_longest_session() {
    use distlock_testkit::zookeeper::ZooKeeperServer;
    let server = ZooKeeperServer::start_with_tick(Duration::from_secs(1))
        .expect("ZooKeeper (apt-get install zookeeper)");
    let url = server.url();
    let home = Home::new();
    let out = home.run(&["--backend", &url, "-v", "run", "--key", "k", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stderr.contains("longest the backend grants") && out.stderr.contains("20s"),
        "{out:?}"
    );
    let out = home.run(&[
        "--backend",
        &url,
        "run",
        "--key",
        "k",
        "--lease",
        "30s",
        "--",
        "true",
    ]);
    assert_eq!(
        out.code,
        Some(2),
        "an explicit lease the server cannot grant: {out:?}"
    );
    assert!(out.stderr.contains("lease"), "{out:?}");
}
