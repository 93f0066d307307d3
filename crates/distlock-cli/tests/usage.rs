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
        vec!["run", "--key", "k", "--shared", "--write", "--", "true"],
        vec![
            "run",
            "--key",
            "k",
            "--write",
            "--permits",
            "2",
            "--",
            "true",
        ],
        vec!["completions", "tcsh"],
        vec!["completions"],
        vec![
            "run",
            "--key",
            "k",
            "--shared",
            "--permits",
            "2",
            "--",
            "true",
        ],
        vec!["run", "--key", "k", "--permits", "0", "--", "true"],
        vec!["unlock"],
        vec!["list", "extra"],
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

/// `run` of `echo ran` on `backend`: it must exit with `code` without running the command and
/// say why on one line, which it returns.
fn refused_before_running(home: &Home, backend: &str, code: i32) -> String {
    let out = home.run(&[
        "--backend",
        backend,
        "run",
        "--key",
        "k",
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(out.code, Some(code), "{out:?}");
    assert_eq!(out.stdout, "", "the command must not run: {out:?}");
    one_stderr_line(&out).to_owned()
}

#[test]
fn unreachable_backend_exits_1_with_one_line() {
    let home = Home::new();
    let line = refused_before_running(&home, "redis://127.0.0.1:1", 1);
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
        ("nosuch://x", 2, "nosuch"),
        ("redis://h:notaport", 2, "port"),
        ("postgres://", 2, "host"),
        ("zk://h:x", 2, "port"),
        ("etcd://h:1?nosuch=1", 2, "nosuch"),
        ("redis+sentinel://h:1", 2, "master"),
        ("redlock://h:1", 2, "three"),
        ("memory://?x=1", 2, "memory://"),
        ("postgres://u:%zz@h:1/db", 2, "password"),
        ("zk://h:1?session_timeout=abc", 2, "session_timeout"),
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

/// A typo in the scheme is a usage error (2), not "backend failed, retry later" (1): the line
/// names the scheme and the known ones, and is short.
#[test]
fn an_unknown_scheme_exits_2_with_a_short_message() {
    let home = Home::new();
    let line = refused_before_running(&home, "foo://bar", 2);
    assert!(line.len() < 400, "{} characters: {line}", line.len());
    assert!(line.contains("unknown scheme \"foo\""), "{line}");
    for known in [
        "memory", "sqlite", "redis", "postgres", "mysql", "zk", "etcd",
    ] {
        assert!(line.contains(known), "{known} missing: {line}");
    }
}

/// A long key is shown by its first characters and its length, wherever an error names it.
#[test]
fn long_keys_are_shortened_in_errors() {
    let home = Home::new();
    let huge = "k".repeat(100_000);
    for args in [
        vec!["run", "--key", &huge, "--", "true"],
        vec!["status", &huge],
        vec!["unlock", &huge, "--force"],
    ] {
        let out = home.run(&args);
        assert_eq!(out.code, Some(2), "{out:?}");
        let line = one_stderr_line(&out);
        assert!(line.len() < 300, "{} characters", line.len());
        assert!(line.contains("100000"), "the length is named: {line}");
    }
    // A key within the limit but long: the busy message shows its start and length.
    let long = "x".repeat(1000);
    let marker = home.path("held");
    let mut holder = Proc::spawn(&mut home.cmd(&[
        "run",
        "--key",
        &long,
        "--",
        "sh",
        "-c",
        r#"touch "$1"; exec sleep 30"#,
        "sh",
        marker.to_str().unwrap(),
    ]));
    wait_for_file(&marker, &mut holder);
    let out = home.run(&["run", "--key", &long, "--no-wait", "--", "true"]);
    assert_eq!(out.code, Some(75), "{out:?}");
    let line = one_stderr_line(&out);
    assert!(line.len() < 200, "{} characters: {line}", line.len());
    assert!(line.contains("(1000 bytes)"), "{line}");
    stop_holder(holder);
}

/// `status`, `list` and `unlock` on a fresh home create neither the directory nor the database.
#[test]
fn looking_creates_nothing() {
    let home = Home::new();
    let fresh = home.path("fresh");
    let look =
        |args: &[&str]| Proc::spawn(home.cmd(args).env("DISTLOCK_HOME", &fresh)).wait(TIMEOUT);
    let out = look(&["status", "k"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stdout.contains("free"), "{out:?}");
    let out = look(&["status", "k", "--json"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert_eq!(json_field(out.stdout.trim(), "held"), "false", "{out:?}");
    let out = look(&["list", "--json"]);
    assert_eq!((out.code, out.stdout.as_str()), (Some(0), ""), "{out:?}");
    let out = look(&["list"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("no locks held"), "{out:?}");
    let out = look(&["unlock", "k", "--force"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(!fresh.exists(), "{} was created", fresh.display());
    // An existing home without a database: still no database.
    let out = home.run(&["status", "k"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(
        !home.path("distlock.db").exists(),
        "the database was created"
    );
    // A usage error stays one, database or not.
    let out = look(&["--prefix", "", "status", "k"]);
    assert_eq!(out.code, Some(2), "{out:?}");
}

/// `--lease 1h` and `?connect_timeout=1h` follow one rule; so does `DISTLOCK_KILL_GRACE`.
#[test]
fn one_duration_rule_for_options_urls_and_the_environment() {
    let home = Home::new();
    let out = home.run(&[
        "run", "--key", "k", "--lease", "1h", "--wait", "10", "--", "true",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    // The URL's duration is accepted: what is left is the unreachable server (1), not a usage
    // error (2) about the parameter.
    let out = home.run(&[
        "--backend",
        "postgres://postgres@127.0.0.1:1/db?connect_timeout=1h",
        "status",
        "k",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("unavailable"), "{out:?}");
    let out = Proc::spawn(
        home.cmd(&["run", "--key", "k", "--", "true"])
            .env("DISTLOCK_KILL_GRACE", "1M"),
    )
    .wait(TIMEOUT);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        one_stderr_line(&out).contains("DISTLOCK_KILL_GRACE"),
        "{out:?}"
    );
}

fn generated(args: &[&str]) -> String {
    let out = Home::new().run(args);
    assert_eq!(out.code, Some(0), "{args:?}: {out:?}");
    assert_eq!(out.stderr, "", "{out:?}");
    out.stdout
}

const SUBCOMMANDS: [&str; 8] = [
    "run",
    "status",
    "list",
    "unlock",
    "demo",
    "serve",
    "completions",
    "man",
];

/// `completions bash|zsh|fish` print scripts that name every subcommand; bash accepts its own.
#[test]
fn completion_scripts_name_the_subcommands() {
    let bash = generated(&["completions", "bash"]);
    let zsh = generated(&["completions", "zsh"]);
    let fish = generated(&["completions", "fish"]);
    assert!(zsh.starts_with("#compdef distlock"), "{zsh}");
    assert!(fish.contains("complete -c distlock"), "{fish}");
    assert!(bash.contains("complete -F _distlock"), "{bash}");
    for script in [&bash, &zsh, &fish] {
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{sub} missing");
        }
        assert!(script.contains("write") && script.contains("backend"));
    }
    let home = Home::new();
    let file = home.path("distlock.bash");
    std::fs::write(&file, &bash).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .expect("bash");
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// `man` prints one roff page: title, name, synopsis, options, a subsection per subcommand
/// with its own options, and the text of `--help`.
#[test]
fn the_man_page_is_roff_naming_the_subcommands() {
    let page = generated(&["man"]);
    assert!(page.starts_with(".ie \\n(.g"), "{page}");
    for section in [
        ".TH distlock 1",
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH OPTIONS",
        ".SH COMMANDS",
    ] {
        assert!(page.contains(section), "{section} missing");
    }
    for sub in SUBCOMMANDS {
        let heading = format!(".SS \"distlock {sub}\"");
        assert!(page.contains(&heading), "{heading} missing");
    }
    assert!(page.contains("\\-\\-write"), "run's own options are there");
    assert!(
        page.contains("DISTLOCK_KILL_GRACE"),
        "the --help text is there too"
    );
}
