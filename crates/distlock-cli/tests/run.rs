//! `distlock run`: the lock around CMD, fences, waiting, exit codes, CMD's options and environment.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

#[test]
fn run_passes_key_and_fence_and_returns_the_exit_code() {
    let home = Home::new();
    let out = home.run(&[
        "run",
        "--key",
        "job:1",
        "--",
        "sh",
        "-c",
        r#"echo "key=$DISTLOCK_KEY fence=$DISTLOCK_FENCE"; exit 7"#,
    ]);
    assert_eq!(out.code, Some(7), "{out:?}");
    let line = out.stdout.trim();
    let fence: u64 = line
        .strip_prefix("key=job:1 fence=")
        .unwrap_or_else(|| panic!("unexpected output {line:?}"))
        .parse()
        .expect("numeric fence");
    assert!(fence > 0);
    assert_eq!(out.stderr, "", "no noise on stderr by default");

    let ok = home.run(&["run", "--key", "job:1", "--", "true"]);
    assert_eq!(ok.code, Some(0), "{ok:?}");
}

#[test]
fn a_command_killed_by_a_signal_gives_128_plus_the_signal() {
    let home = Home::new();
    let out = home.run(&["run", "--key", "k", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.code, Some(128 + 9), "{out:?}");
}

#[test]
fn fences_strictly_increase_across_runs() {
    let home = Home::new();
    let mut last = 0u64;
    for _ in 0..4 {
        let out = home.run(&[
            "run",
            "--key",
            "f",
            "--",
            "sh",
            "-c",
            r#"echo "$DISTLOCK_FENCE""#,
        ]);
        assert_eq!(out.code, Some(0), "{out:?}");
        let fence: u64 = out.stdout.trim().parse().expect("fence");
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
    }
}

#[test]
fn second_no_wait_run_exits_75_while_the_first_holds() {
    let home = Home::new();
    let (holder, _) = home.hold(&[], "busy", &[]);
    let out = home.run(&[
        "run",
        "--key",
        "busy",
        "--no-wait",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(out.stdout, "", "the command must not run");
    assert!(one_stderr_line(&out).contains("busy"), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");

    // Another key is independent.
    let other = home.run(&["run", "--key", "other", "--no-wait", "--", "true"]);
    assert_eq!(other.code, Some(0), "{other:?}");

    holder.signal(Signal::SIGTERM);
    let held = holder.wait(TIMEOUT);
    assert_eq!(held.code, Some(128 + Signal::SIGTERM as i32), "{held:?}");
}

#[test]
fn wait_gives_up_after_its_duration_with_75() {
    let home = Home::new();
    let (holder, _) = home.hold(&[], "w", &[]);
    let out = home.run(&["run", "--key", "w", "--wait", "300ms", "--", "true"]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(out.elapsed >= Duration::from_millis(300), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
    one_stderr_line(&out);
    drop(holder);
}

#[test]
fn a_waiting_run_gets_the_lock_once_the_holder_is_done() {
    let home = Home::new();
    let marker = home.path("first-holds");
    let mut first = Proc::spawn(&mut home.cmd(&[
        "run",
        "--key",
        "seq",
        "--",
        "sh",
        "-c",
        r#"touch "$1"; sleep 0.6"#,
        "sh",
        marker.to_str().unwrap(),
    ]));
    wait_for_file(&marker, &mut first);
    let second = home.run(&["run", "--key", "seq", "--", "sh", "-c", "exit 3"]);
    assert_eq!(second.code, Some(3), "{second:?}");
    assert!(
        second.elapsed >= Duration::from_millis(250),
        "it waited: {second:?}"
    );
    let first = first.wait(TIMEOUT);
    assert_eq!(first.code, Some(0), "{first:?}");
}

#[test]
fn concurrent_waiting_runs_never_overlap() {
    let home = Home::new();
    let procs = exclusive_runs(
        &home,
        &[],
        "mutex",
        &[],
        r#"mkdir "$1" || exit 99; sleep 0.2; rmdir "$1""#,
        4,
    );
    for p in procs {
        let out = p.wait(TIMEOUT);
        assert_eq!(out.code, Some(0), "overlap or failure: {out:?}");
    }
}

#[test]
fn renewal_keeps_a_short_lease_alive_while_the_command_runs() {
    let home = Home::new();
    let marker = home.path("renewing");
    let mut holder = Proc::spawn(&mut home.cmd(&[
        "run",
        "--key",
        "r",
        "--lease",
        "400ms",
        "--",
        "sh",
        "-c",
        r#"touch "$1"; sleep 1.5"#,
        "sh",
        marker.to_str().unwrap(),
    ]));
    wait_for_file(&marker, &mut holder);
    std::thread::sleep(Duration::from_millis(1000));
    let probe = home.run(&["run", "--key", "r", "--no-wait", "--", "true"]);
    assert_eq!(
        probe.code,
        Some(75),
        "still held after 2.5 leases: {probe:?}"
    );
    let out = holder.wait(TIMEOUT);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn command_not_found_exits_127_and_releases() {
    let home = Home::new();
    let out = home.run(&["run", "--key", "nf", "--", "distlock-no-such-command-xyz"]);
    assert_eq!(out.code, Some(127), "{out:?}");
    assert!(one_stderr_line(&out).contains("not found"), "{out:?}");
    let next = home.run(&["run", "--key", "nf", "--no-wait", "--", "true"]);
    assert_eq!(next.code, Some(0), "released: {next:?}");
}

// ---------------------------------------------------------------------------------------------
// `run`'s options and CMD (issue 8)

#[test]
fn unknown_run_options_are_usage_errors_never_the_command() {
    let home = Home::new();
    let out = home.run(&["run", "--key", "k", "--bogus", "--", "true"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(one_stderr_line(&out).contains("--bogus"), "{out:?}");

    // A misspelled option before a real command: a usage error, and nothing runs.
    let script = home.path("x");
    std::fs::write(&script, "#!/bin/sh\ntouch \"$0.ran\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script_s = script.to_str().unwrap();
    let out = home.run(&["run", "--key", "k", "--wiat", "5s", "--", script_s]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(one_stderr_line(&out).contains("--wiat"), "{out:?}");
    assert!(!home.path("x.ran").exists(), "the command must not run");
    // Spelled right, it runs.
    let out = home.run(&["run", "--key", "k", "--wait", "5s", "--", script_s]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(home.path("x.ran").exists(), "{out:?}");
}

#[test]
fn cmd_starts_after_dash_dash_or_at_the_first_word_that_is_not_an_option() {
    let home = Home::new();
    let out = home.run(&["run", "--key", "k", "echo", "hi"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "hi\n"),
        "{out:?}"
    );

    // After `--` everything is CMD, even what looks like an option.
    let out = home.run(&["run", "--key", "k", "--", "--weird"]);
    assert_eq!(out.code, Some(127), "{out:?}");
    assert!(one_stderr_line(&out).contains("--weird"), "{out:?}");
    let out = home.run(&[
        "run",
        "--key",
        "k",
        "--",
        "sh",
        "-c",
        r#"printf '%s|' "$@""#,
        "sh",
        "--bogus",
        "--key",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "--bogus|--key|", "{out:?}");

    // Options after CMD's first word are CMD's.
    let out = home.run(&["run", "--key", "k", "sh", "-c", "exit 3"]);
    assert_eq!(out.code, Some(3), "{out:?}");
}

#[test]
fn the_commands_environment_has_no_backend_url() {
    let home = Home::new();
    let url = format!("sqlite://{}/e.db", home.dir.path().display());
    let out = Proc::spawn(
        home.cmd(&[
            "run",
            "--key",
            "env",
            "--",
            "sh",
            "-c",
            r#"echo "backend=${DISTLOCK_BACKEND-unset} key=$DISTLOCK_KEY"; env"#,
        ])
        .env("DISTLOCK_BACKEND", &url),
    )
    .wait(TIMEOUT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.starts_with("backend=unset key=env\n"), "{out:?}");
    assert!(!out.stdout.contains(&url), "{out:?}");
    assert!(home.path("e.db").exists(), "distlock itself used it");
}

#[test]
fn the_command_inherits_no_file_descriptor_of_distlock() {
    let home = Home::new();
    // `ls` lists its own descriptors: what it inherited, plus the directory it reads.
    let list = "exec ls /proc/self/fd";
    let direct =
        Proc::spawn(Command::new("sh").args(["-c", list]).stdin(Stdio::null())).wait(TIMEOUT);
    let via = home.run(&["run", "--key", "fd", "--", "sh", "-c", list]);
    assert_eq!(via.code, Some(0), "{via:?}");
    assert_eq!(via.stdout, direct.stdout, "{via:?} vs {direct:?}");
}

#[test]
fn status_and_list_name_the_owner_of_a_run() {
    let home = Home::new();
    let (holder, _) = home.hold(&[], "owned", &["--owner", "nightly report"]);
    let status = home.run(&["status", "owned", "--json"]);
    assert_eq!(status.code, Some(0), "{status:?}");
    let json: serde_json::Value = serde_json::from_str(status.stdout.trim()).unwrap();
    assert_eq!(
        json["owners"],
        serde_json::json!(["nightly report"]),
        "{json}"
    );
    let text = home.run(&["status", "owned"]);
    assert!(text.stdout.contains("held by nightly report"), "{text:?}");
    holder.signal(Signal::SIGTERM);
    holder.wait(TIMEOUT);

    // Without --owner: <hostname>:<pid> of the run.
    let (holder, _) = home.hold(&[], "default-owner", &[]);
    let listed = home.run(&["list", "--json"]);
    let line: serde_json::Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    let owner = line["owners"][0].as_str().unwrap_or_default().to_owned();
    assert!(
        owner.ends_with(&format!(":{}", holder.child.id())),
        "owner {owner:?} should end with the run's pid"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait(TIMEOUT);
}

#[test]
fn a_bad_owner_is_a_usage_error() {
    let home = Home::new();
    for bad in ["", "redis://u:secret@h", &"x".repeat(129)] {
        let out = home.run(&["run", "--key", "k", "--owner", bad, "--", "true"]);
        assert_eq!(out.code, Some(2), "{bad:?}: {out:?}");
    }
}

#[test]
fn at_least_keeps_the_lock_after_a_quick_command() {
    let home = Home::new();
    let at_least = Duration::from_millis(1500);
    let quick =
        Proc::spawn(&mut home.cmd(&["run", "--key", "job", "--at-least", "1500ms", "--", "true"]));
    // While the run keeps the lock after `true` ended, nobody else gets it.
    assert!(
        eventually(TIMEOUT, || home.run(&["status", "job"]).code == Some(0)),
        "the lock was never seen held"
    );
    let busy = home.run(&["run", "--key", "job", "--no-wait", "--", "true"]);
    let done = quick.wait(TIMEOUT);
    assert_eq!(done.code, Some(0), "{done:?}");
    assert!(
        done.elapsed >= at_least,
        "released after {:?}",
        done.elapsed
    );
    if busy.elapsed < at_least {
        assert_eq!(busy.code, Some(75), "taken during --at-least: {busy:?}");
    }
    let after = home.run(&["run", "--key", "job", "--no-wait", "--", "true"]);
    assert_eq!(after.code, Some(0), "{after:?}");

    let too_long = home.run(&["run", "--key", "job", "--at-least", "2d", "--", "true"]);
    assert_eq!(too_long.code, Some(2), "{too_long:?}");
}
