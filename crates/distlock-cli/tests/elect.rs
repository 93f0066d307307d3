//! `distlock elect` and `distlock leader`: one leader at a time, its term in CMD's environment,
//! who leads as `leader` shows it, and every change with `--watch`.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

#[test]
fn elect_runs_cmd_while_leading_and_leader_names_it() {
    let home = Home::new();
    let out = home.run(&[
        "elect",
        "--name",
        "jobs",
        "--id",
        "alpha",
        "--",
        "sh",
        "-c",
        "test \"$DISTLOCK_TERM\" = \"$DISTLOCK_FENCE\" && echo \"term $DISTLOCK_TERM\"; exit 4",
    ]);
    assert_eq!(out.code, Some(4), "CMD's status: {out:?}");
    let term: u64 = out
        .stdout
        .trim()
        .strip_prefix("term ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no term: {out:?}"));
    assert!(term > 0);

    let none = home.run(&["leader", "jobs"]);
    assert_eq!(none.code, Some(3), "nobody leads: {none:?}");
    assert_eq!(none.stdout.trim(), r#""jobs": no leader"#);

    // A leader that stays; `leader` names it; a second candidate waits for it.
    let (leader, _) = home.hold(&[], "jobs", &["--owner", "alpha"]);
    let shown = home.run(&["leader", "jobs", "--json"]);
    assert_eq!(shown.code, Some(0), "{shown:?}");
    let json: serde_json::Value = serde_json::from_str(shown.stdout.trim()).unwrap();
    assert_eq!(json["leader"], "alpha", "{json}");
    assert!(json["term"].as_u64().unwrap() > term, "terms rise: {json}");

    let watch = Proc::spawn(&mut home.cmd(&["leader", "jobs", "--watch"]));
    let standby = Proc::spawn(&mut home.cmd(&[
        "elect", "--name", "jobs", "--id", "beta", "--", "sh", "-c", "sleep 1",
    ]));
    std::thread::sleep(Duration::from_millis(500));
    leader.signal(Signal::SIGTERM);
    leader.wait(TIMEOUT);
    let took_over = standby.wait(TIMEOUT);
    assert_eq!(took_over.code, Some(0), "{took_over:?}");
    watch.signal(Signal::SIGINT);
    let watched = watch.wait(TIMEOUT);
    let lines: Vec<&str> = watched.stdout.lines().collect();
    let alpha = lines.iter().position(|l| l.contains("led by alpha"));
    let beta = lines.iter().position(|l| l.contains("led by beta"));
    assert!(
        matches!((alpha, beta), (Some(a), Some(b)) if a < b),
        "--watch shows alpha, then beta: {lines:?}"
    );
}

#[test]
fn elect_needs_a_name_and_a_command() {
    let home = Home::new();
    assert_eq!(home.run(&["elect", "--", "true"]).code, Some(2));
    assert_eq!(home.run(&["elect", "--name", "n"]).code, Some(2));
    assert_eq!(
        home.run(&["elect", "--name", "n", "--id", "", "--", "true"])
            .code,
        Some(2)
    );
}
