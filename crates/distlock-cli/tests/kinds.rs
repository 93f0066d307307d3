//! `run --shared`, `run --write`, `run --permits N`, several `--key`, `list` and `unlock --force` from the
//! command line, on every backend a `distlock` process can share with another: the default
//! SQLite file, Redis, PostgreSQL, MariaDB, ZooKeeper and etcd.

mod common;

use common::*;
use nix::sys::signal::Signal;

fn args<'a>(pre: &[&'a str], rest: &[&'a str]) -> Vec<&'a str> {
    pre.iter().chain(rest).copied().collect()
}

/// `run --key <key> <extra> --no-wait -- echo ran`: one attempt that gives up at once.
fn try_run(home: &Home, pre: &[&str], key: &str, extra: &[&str]) -> Output {
    let mut run = vec!["run", "--key", key];
    run.extend(extra);
    run.extend(["--no-wait", "--", "echo", "ran"]);
    home.run(&args(pre, &run))
}

/// The `status --json` (or `list --json` line) fields that say who holds a key: kind and
/// holders must match where the backend reports them (`null` where it cannot tell).
fn assert_holds(json: &str, kind: &str, holders: u32) {
    let shown = json_field(json, "kind");
    assert!(
        shown == "null" || shown == format!("\"{kind}\""),
        "kind {shown}, expected {kind}: {json}"
    );
    let n = json_field(json, "holders");
    assert!(
        n == "null" || n == holders.to_string(),
        "holders {n}, expected {holders}: {json}"
    );
}

fn shared_holders_exclude_exclusive_runs(home: &Home, pre: &[&str]) {
    let (r1, f1) = home.hold(pre, "rw", &["--shared"]);
    // A second shared holder gets the key beside the first (else `hold` times out).
    let (r2, f2) = home.hold(pre, "rw", &["--shared"]);
    assert_ne!(f1, f2, "each shared holder has its own fence");
    let busy = try_run(home, pre, "rw", &[]);
    assert_eq!(
        busy.code,
        Some(75),
        "an exclusive run beside readers: {busy:?}"
    );
    assert_eq!(busy.stdout, "");
    let status = home.run(&args(pre, &["status", "rw", "--json"]));
    assert_eq!(status.code, Some(0), "{status:?}");
    assert_holds(status.stdout.trim(), "read", 2);
    let text = home.run(&args(pre, &["status", "rw"]));
    assert!(text.stdout.contains("held"), "{text:?}");
    stop_holder(r1);
    stop_holder(r2);
    let (w, _) = home.hold(pre, "rw", &[]);
    let busy = try_run(home, pre, "rw", &["--shared"]);
    assert_eq!(
        busy.code,
        Some(75),
        "a shared run beside a writer: {busy:?}"
    );
    stop_holder(w);
}

/// `--write` is the write side of the key's read-write lock: shared holders keep it out, and
/// it keeps them (and another writer) out.
fn the_write_side_excludes_shared_holders(home: &Home, pre: &[&str]) {
    let (r, _) = home.hold(pre, "wr", &["--shared"]);
    let busy = try_run(home, pre, "wr", &["--write"]);
    assert_eq!(busy.code, Some(75), "a writer beside a reader: {busy:?}");
    assert_eq!(busy.stdout, "");
    stop_holder(r);
    let (w, _) = home.hold(pre, "wr", &["--write"]);
    let status = home.run(&args(pre, &["status", "wr", "--json"]));
    assert_eq!(status.code, Some(0), "{status:?}");
    assert_holds(status.stdout.trim(), "write", 1);
    for extra in [&["--shared"][..], &["--write"]] {
        let busy = try_run(home, pre, "wr", extra);
        assert_eq!(busy.code, Some(75), "{extra:?} beside a writer: {busy:?}");
        assert_eq!(busy.stdout, "");
    }
    stop_holder(w);
}

fn permits_admit_n_holders(home: &Home, pre: &[&str]) {
    let (p1, _) = home.hold(pre, "sem", &["--permits", "2"]);
    let (p2, _) = home.hold(pre, "sem", &["--permits", "2"]);
    let busy = try_run(home, pre, "sem", &["--permits", "2"]);
    assert_eq!(busy.code, Some(75), "a third permit of two: {busy:?}");
    let disagree = try_run(home, pre, "sem", &["--permits", "3"]);
    assert_eq!(
        disagree.code,
        Some(2),
        "another number of permits: {disagree:?}"
    );
    assert!(
        one_stderr_line(&disagree).contains("permit"),
        "{disagree:?}"
    );
    let status = home.run(&args(pre, &["status", "sem", "--json"]));
    assert_holds(status.stdout.trim(), "semaphore", 2);
    stop_holder(p1);
    let ok = try_run(home, pre, "sem", &["--permits", "2"]);
    assert_eq!(ok.code, Some(0), "a permit came back: {ok:?}");
    assert_eq!(ok.stdout.trim(), "ran");
    stop_holder(p2);
}

fn several_keys_are_all_or_nothing(home: &Home, pre: &[&str]) {
    let (b, _) = home.hold(pre, "mb", &[]);
    let busy = try_run(home, pre, "ma", &["--key", "mb"]);
    assert_eq!(busy.code, Some(75), "{busy:?}");
    assert!(
        one_stderr_line(&busy).contains("\"mb\""),
        "names the busy key: {busy:?}"
    );
    let free = home.run(&args(pre, &["status", "ma"]));
    assert_eq!(free.code, Some(3), "the failed run gave ma back: {free:?}");
    stop_holder(b);
    let out = home.run(&args(
        pre,
        &[
            "run",
            "--key",
            "mb",
            "--key",
            "ma",
            "--",
            "sh",
            "-c",
            r#"printf '%s %s %s' "$DISTLOCK_KEY" "$DISTLOCK_FENCE" "$DISTLOCK_FENCES""#,
        ],
    ));
    assert_eq!(out.code, Some(0), "{out:?}");
    let (key, rest) = out.stdout.split_once(' ').unwrap();
    let (fence, fences) = rest.split_once(' ').unwrap();
    assert_eq!(key, "mb", "DISTLOCK_KEY is the first key given");
    let fences: serde_json::Value = serde_json::from_str(fences).expect("DISTLOCK_FENCES is JSON");
    assert_eq!(fences["mb"].to_string(), fence, "{fences}");
    assert!(fences["ma"].as_u64().is_some(), "{fences}");
    let dup = home.run(&args(
        pre,
        &["run", "--key", "x", "--key", "x", "--", "true"],
    ));
    assert_eq!(dup.code, Some(2), "a key given twice: {dup:?}");
}

fn list_and_unlock(home: &Home, pre: &[&str]) {
    let (m, _) = home.hold(pre, "lm", &["--lease", "1s"]);
    let (r, _) = home.hold(pre, "lr", &["--shared"]);
    let list = home.run(&args(pre, &["list", "--json"]));
    assert_eq!(list.code, Some(0), "{list:?}");
    let lines: Vec<&str> = list.stdout.lines().collect();
    let keys: Vec<&str> = lines.iter().map(|l| json_field(l, "key")).collect();
    assert_eq!(keys, ["\"lm\"", "\"lr\""], "{list:?}");
    assert_holds(lines[0], "mutex", 1);
    assert_holds(lines[1], "read", 1);
    let text = home.run(&args(pre, &["list"]));
    assert_eq!(text.stdout.lines().count(), 2, "{text:?}");

    let refused = home.run(&args(pre, &["unlock", "lm"]));
    assert_eq!(refused.code, Some(2), "unlock without --force: {refused:?}");
    let removed = home.run(&args(pre, &["unlock", "lm", "--force"]));
    assert_eq!(removed.code, Some(0), "{removed:?}");
    assert!(
        removed.stdout.contains("removed lock \"lm\""),
        "{removed:?}"
    );
    // The holder finds it lost at its next renewal (a third of its 1 s lease) and stops.
    let out = m.wait(TIMEOUT);
    assert_eq!(out.code, Some(76), "the holder of a removed lock: {out:?}");
    let again = home.run(&args(pre, &["unlock", "lm", "--force"]));
    assert_eq!(again.code, Some(3), "nothing left to remove: {again:?}");
    let removed = home.run(&args(pre, &["unlock", "lr", "--force"]));
    assert_eq!(
        removed.code,
        Some(0),
        "a shared hold is removed too: {removed:?}"
    );
    r.signal(Signal::SIGTERM);
    let _ = r.wait(TIMEOUT);
    let empty = home.run(&args(pre, &["list", "--json"]));
    assert_eq!(empty.stdout, "", "{empty:?}");
}

fn every_kind(pre: &[&str]) {
    let home = Home::new();
    shared_holders_exclude_exclusive_runs(&home, pre);
    the_write_side_excludes_shared_holders(&home, pre);
    permits_admit_n_holders(&home, pre);
    several_keys_are_all_or_nothing(&home, pre);
    list_and_unlock(&home, pre);
}

#[test]
fn kinds_on_the_default_sqlite_file() {
    every_kind(&[]);
}

#[test]
fn kinds_on_redis() {
    let server = distlock_testkit::redis::RedisServer::start()
        .expect("redis-server (scripts/test.sh installs it)");
    every_kind(&["--backend", &server.url()]);
}

#[test]
fn kinds_on_postgres() {
    let db = fresh_postgres();
    every_kind(&["--backend", db.url()]);
}

#[test]
fn kinds_on_mariadb() {
    let db = fresh_mariadb();
    every_kind(&["--backend", db.url()]);
}

#[test]
fn kinds_on_zookeeper() {
    let server = distlock_testkit::zookeeper::ZooKeeperServer::start()
        .expect("ZooKeeper (scripts/test.sh installs zookeeper)");
    every_kind(&["--backend", &server.url()]);
}

#[test]
fn kinds_on_etcd() {
    let server = distlock_testkit::etcd::EtcdServer::start()
        .expect("etcd (scripts/test.sh installs etcd-server)");
    every_kind(&["--backend", &server.url()]);
}
