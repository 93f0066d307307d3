//! Usage errors, help, unreachable or malformed backends, which backend is chosen, `--verbose`.

mod common;

use common::*;

#[test]
fn usage_errors_exit_2_with_one_line() {
    let home = Home::new();
    let long_key = "k".repeat(1025);
    let cases: Vec<Vec<&str>> = vec![
        vec!["run", "--key", "k", "--lease", "abc", "--", "true"],
        vec!["run", "--key", "k", "--wait", "5x", "--", "true"],
        vec!["run", "--key", "k", "--lease", "0s", "--", "true"],
        vec!["run", "--key", "k", "--lease", "25h", "--", "true"],
        vec!["run", "--key", "", "--", "true"],
        vec!["run", "--key", &long_key, "--", "true"],
        vec!["run", "--key", "k"],
        vec!["run", "--key", "k", "--"],
        vec!["run", "--", "true"],
        vec![
            "run",
            "--key",
            "k",
            "--wait",
            "1s",
            "--no-wait",
            "--",
            "true",
        ],
        vec!["status"],
        vec!["status", ""],
        vec!["demo", "--workers", "0"],
        vec!["demo", "--hold", "soon"],
        vec!["--prefix", "", "status", "k"],
        vec!["frobnicate"],
    ];
    for args in cases {
        let out = home.run(&args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        one_stderr_line(&out);
    }
    // The key is checked before any connection: an unreachable backend does not matter.
    let out = home.run(&[
        "--backend",
        "redis://127.0.0.1:1",
        "run",
        "--key",
        "",
        "--",
        "true",
    ]);
    assert_eq!(out.code, Some(2), "{out:?}");
    let out = home.run(&["run", "--key", "k", "--lease", "0s", "--", "true"]);
    assert!(out.stderr.contains("lease"), "{out:?}");
}

#[test]
fn help_exits_0() {
    let home = Home::new();
    let out = home.run(&["--help"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("run") && out.stdout.contains("status") && out.stdout.contains("demo")
    );
    let out = home.run(&["run", "--help"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("--no-wait"), "{out:?}");
}

#[test]
fn unreachable_backend_exits_1_with_one_line() {
    let home = Home::new();
    let out = home.run(&[
        "--backend",
        "redis://127.0.0.1:1",
        "run",
        "--key",
        "k",
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_eq!(out.stdout, "", "the command must not run: {out:?}");
    let line = one_stderr_line(&out);
    assert!(line.contains("redis"), "{line}");

    let out = home.run(&["--backend", "redis://127.0.0.1:1", "status", "k"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    one_stderr_line(&out);

    let out = home.run(&[
        "--backend",
        "redis://127.0.0.1:1",
        "demo",
        "--workers",
        "2",
        "--hold",
        "10ms",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
}

#[test]
fn passwords_do_not_leak_into_errors() {
    let home = Home::new();
    let out = home.run(&[
        "--backend",
        "redis://user:hunter2@127.0.0.1:1?allow_insecure_auth=true",
        "status",
        "k",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(!out.stderr.contains("hunter2"), "{out:?}");
    one_stderr_line(&out);
    // Without the opt-in, a password over plain TCP is refused before anything is sent.
    let out = home.run(&[
        "--backend",
        "redis://user:hunter2@127.0.0.1:1",
        "status",
        "k",
    ]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(!out.stderr.contains("hunter2"), "{out:?}");
    assert!(
        one_stderr_line(&out).contains("allow_insecure_auth"),
        "{out:?}"
    );
}

#[test]
fn malformed_urls_are_named() {
    let home = Home::new();
    for (url, code, needle) in [
        ("nonsense", 2, "scheme"),
        ("sqlite://relative.db", 2, "absolute"),
        ("sqlite:///", 2, "path"),
        ("redis://", 2, "host"),
        ("redis://127.0.0.1:1/notanumber", 2, "database"),
        ("nosuch://x", 1, "nosuch"),
    ] {
        let out = home.run(&["--backend", url, "status", "k"]);
        assert_eq!(out.code, Some(code), "{url}: {out:?}");
        let line = one_stderr_line(&out);
        assert!(line.contains(needle), "{url}: {line}");
    }
}

#[test]
fn backend_flag_wins_over_the_environment() {
    let home = Home::new();
    let out = Proc::spawn(
        home.cmd(&["status", "k"])
            .env("DISTLOCK_BACKEND", "redis://127.0.0.1:1"),
    )
    .wait(TIMEOUT);
    assert_eq!(out.code, Some(1), "the environment is used: {out:?}");

    let out = Proc::spawn(
        home.cmd(&["--backend", "memory://", "status", "k"])
            .env("DISTLOCK_BACKEND", "redis://127.0.0.1:1"),
    )
    .wait(TIMEOUT);
    assert_eq!(out.code, Some(3), "--backend wins: {out:?}");
    assert!(out.stdout.contains("memory"), "{out:?}");
}

#[test]
fn the_default_backend_is_sqlite_in_distlock_home() {
    let home = Home::new();
    let out = home.run(&["run", "--key", "k", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        home.path("distlock.db").is_file(),
        "distlock.db created in DISTLOCK_HOME"
    );

    // Without DISTLOCK_HOME: $XDG_DATA_HOME/distlock, created on demand.
    let xdg = home.path("xdg");
    let out = Proc::spawn(
        home.cmd(&["run", "--key", "k", "--", "true"])
            .env_remove("DISTLOCK_HOME")
            .env("XDG_DATA_HOME", &xdg),
    )
    .wait(TIMEOUT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(xdg.join("distlock").join("distlock.db").is_file());
}

#[test]
fn verbose_turns_on_logging() {
    let home = Home::new();
    let out = home.run(&["-v", "run", "--key", "v", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("DEBUG"), "{out:?}");
}
