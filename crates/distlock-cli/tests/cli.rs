//! Black-box tests of the `distlock` binary. Each test gets its own `DISTLOCK_HOME`, so the
//! default backend is a fresh SQLite file; the Redis tests start a throwaway `redis-server`.
//! Every process is waited for with a timeout and killed if it overstays.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use distlock::testkit::redis::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");
const TIMEOUT: Duration = Duration::from_secs(20);

/// A test's private home: the SQLite database lives here, and so do marker files.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        Home {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `distlock ARGS` with this home and a clean environment.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("DISTLOCK_HOME", self.dir.path())
            .env_remove("DISTLOCK_BACKEND")
            .env_remove("DISTLOCK_KILL_GRACE")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `distlock ARGS` to completion (with a timeout).
    fn run(&self, args: &[&str]) -> Output {
        Proc::spawn(&mut self.cmd(args)).wait(TIMEOUT)
    }

    /// Starts `distlock [PRE...] run --key KEY [EXTRA...] -- sh -c 'write fence and pid; exec sleep 30'`
    /// and waits until the command runs. Returns the process and the fence it got.
    fn hold(&self, pre: &[&str], key: &str, extra: &[&str]) -> (Proc, u64) {
        let marker = self.path(&format!("held-{key}-{}", unique()));
        let marker_s = marker.to_str().unwrap().to_owned();
        let mut args: Vec<&str> = pre.to_vec();
        args.extend(["run", "--key", key]);
        args.extend(extra);
        args.extend([
            "--",
            "sh",
            "-c",
            r#"echo $$ > "$1.pid"; printf %s "$DISTLOCK_FENCE" > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 30"#,
            "sh",
            &marker_s,
        ]);
        let mut proc = Proc::spawn(&mut self.cmd(&args));
        let fence = wait_for_file(&marker, &mut proc);
        (proc, fence.parse().expect("numeric DISTLOCK_FENCE"))
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Waits until `path` exists and returns its content; fails if `proc` exits first.
fn wait_for_file(path: &Path, proc: &mut Proc) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        if let Ok(Some(status)) = proc.child.try_wait() {
            let out = proc.finish(status);
            panic!("holder exited before taking the lock: {out:?}");
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[derive(Debug)]
struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// A running `distlock` whose output is collected; killed on drop if still running.
struct Proc {
    child: Child,
    started: Instant,
    readers: Option<(JoinHandle<String>, JoinHandle<String>)>,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn distlock");
        let read = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            })
        };
        let out = read(Box::new(child.stdout.take().unwrap()));
        let err = read(Box::new(child.stderr.take().unwrap()));
        Proc {
            child,
            started: Instant::now(),
            readers: Some((out, err)),
        }
    }

    fn signal(&self, sig: i32) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// Waits at most `timeout` for the process to end; kills it and fails the test otherwise.
    fn wait(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return self.finish(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let status = self.child.wait().expect("wait");
                let out = self.finish(status);
                panic!("distlock did not finish within {timeout:?}: {out:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn finish(&mut self, status: std::process::ExitStatus) -> Output {
        let elapsed = self.started.elapsed();
        let (out, err) = self.readers.take().expect("finished once");
        // The command's grandchildren may keep the pipes open: do not wait for them forever.
        let join = |h: JoinHandle<String>| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                h.join().unwrap_or_default()
            } else {
                String::from("<output still open>")
            }
        };
        Output {
            code: status.code(),
            stdout: join(out),
            stderr: join(err),
            elapsed,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The single stderr line of a failed run.
fn one_stderr_line(out: &Output) -> &str {
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one stderr line expected: {out:?}");
    assert!(lines[0].starts_with("distlock: "), "{out:?}");
    lines[0]
}

/// The raw text of `"field":value` in a flat JSON object.
fn json_field<'a>(json: &'a str, field: &str) -> &'a str {
    let needle = format!("\"{field}\":");
    let start = json
        .find(&needle)
        .unwrap_or_else(|| panic!("no {field} in {json}"))
        + needle.len();
    let rest = &json[start..];
    let end = match rest.strip_prefix('"') {
        Some(string) => string.find('"').expect("closing quote") + 2,
        None => rest.find([',', '}']).expect("end of value"),
    };
    &rest[..end]
}

fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn read_pid(marker_dir: &Home, key: &str) -> libc::pid_t {
    // The holder writes `<marker>.pid`; find it.
    let entries = std::fs::read_dir(marker_dir.dir.path()).unwrap();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("held-{key}-")) && name.ends_with(".pid") {
            return std::fs::read_to_string(e.path())
                .unwrap()
                .trim()
                .parse()
                .unwrap();
        }
    }
    panic!("no pid file for {key}");
}

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

    holder.signal(libc::SIGTERM);
    let held = holder.wait(TIMEOUT);
    assert_eq!(held.code, Some(128 + libc::SIGTERM), "{held:?}");
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
    let dir = home.path("inside");
    let dir = dir.to_str().unwrap();
    let procs: Vec<Proc> = (0..4)
        .map(|_| {
            Proc::spawn(&mut home.cmd(&[
                "run",
                "--key",
                "mutex",
                "--",
                "sh",
                "-c",
                r#"mkdir "$1" || exit 99; sleep 0.2; rmdir "$1""#,
                "sh",
                dir,
            ]))
        })
        .collect();
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
        "redis://user:hunter2@127.0.0.1:1",
        "status",
        "k",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(!out.stderr.contains("hunter2"), "{out:?}");
    one_stderr_line(&out);
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
fn status_reports_free_and_held() {
    let home = Home::new();
    let out = home.run(&["status", "s"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stdout.contains("free"), "{out:?}");

    let out = home.run(&["status", "s", "--json"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    let json = out.stdout.trim();
    assert_eq!(json_field(json, "held"), "false", "{json}");

    let (holder, fence) = home.hold(&[], "s", &["--lease", "5s"]);
    let out = home.run(&["status", "s", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let json = out.stdout.trim();
    assert!(
        json.starts_with('{') && json.ends_with('}') && !json.contains('\n'),
        "{json}"
    );
    assert_eq!(json_field(json, "key"), "\"s\"");
    assert_eq!(json_field(json, "held"), "true");
    assert_eq!(
        json_field(json, "fence"),
        fence.to_string(),
        "same fence as DISTLOCK_FENCE"
    );
    assert_eq!(json_field(json, "backend"), "\"sqlite\"");
    let remaining: u64 = json_field(json, "remaining_ms")
        .parse()
        .expect("remaining_ms");
    assert!(remaining > 0 && remaining <= 5000, "{json}");

    let out = home.run(&["status", "s"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("held") && out.stdout.contains(&fence.to_string()),
        "{out:?}"
    );
    drop(holder);
}

#[test]
fn status_json_escapes_the_key() {
    let home = Home::new();
    let out = home.run(&["--backend", "memory://", "status", "a\"b\\c\nd", "--json"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stdout.starts_with(r#"{"key":"a\"b\\c\nd","#), "{out:?}");
}

#[test]
fn sigterm_is_forwarded_and_the_lock_released() {
    let home = Home::new();
    let (holder, _) = home.hold(&[], "t", &[]);
    let child_pid = read_pid(&home, "t");
    assert!(process_exists(child_pid));
    holder.signal(libc::SIGTERM);
    let out = holder.wait(Duration::from_secs(5));
    assert_eq!(
        out.code,
        Some(128 + libc::SIGTERM),
        "the command died of SIGTERM: {out:?}"
    );
    assert!(!process_exists(child_pid), "the command is gone");

    let next = home.run(&["run", "--key", "t", "--no-wait", "--", "true"]);
    assert_eq!(next.code, Some(0), "the lock was released: {next:?}");
    assert!(next.elapsed < Duration::from_secs(3), "{next:?}");
}

#[test]
fn sigint_reaches_the_command_which_decides_the_exit_code() {
    let home = Home::new();
    let marker = home.path("int-ready");
    let mut proc = Proc::spawn(&mut home.cmd(&[
        "run",
        "--key",
        "i",
        "--",
        "sh",
        "-c",
        r#"trap 'exit 42' INT; touch "$1"; while :; do sleep 0.05; done"#,
        "sh",
        marker.to_str().unwrap(),
    ]));
    wait_for_file(&marker, &mut proc);
    proc.signal(libc::SIGINT);
    let out = proc.wait(Duration::from_secs(5));
    assert_eq!(out.code, Some(42), "{out:?}");
    let next = home.run(&["run", "--key", "i", "--no-wait", "--", "true"]);
    assert_eq!(next.code, Some(0), "released: {next:?}");
}

#[test]
fn a_signal_while_waiting_gives_up_without_taking_the_lock() {
    let home = Home::new();
    let (holder, _) = home.hold(&[], "q", &[]);
    // Its debug log says when it has started waiting (signal handlers are installed by then).
    let log_path = home.path("waiter.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut waiter = home
        .cmd(&["-v", "run", "--key", "q", "--", "echo", "ran"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while !std::fs::read_to_string(&log_path)
        .unwrap_or_default()
        .contains("acquiring")
    {
        assert!(
            waiter.try_wait().unwrap().is_none(),
            "the waiter ended early"
        );
        assert!(
            Instant::now() < deadline,
            "the waiter never started waiting"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let pid = libc::pid_t::try_from(waiter.id()).unwrap();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = waiter.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(5) {
            let _ = waiter.kill();
            panic!("the waiter ignored SIGINT");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{status:?}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("interrupted"), "{log}");
    let status = home.run(&["status", "q"]);
    assert_eq!(status.code, Some(0), "the holder still holds: {status:?}");
    drop(holder);
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

#[test]
fn verbose_turns_on_logging() {
    let home = Home::new();
    let out = home.run(&["-v", "run", "--key", "v", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("DEBUG"), "{out:?}");
}

/// The `(+X.XXs)` offsets and fences of the demo's acquisition lines.
fn demo_acquisitions(stdout: &str) -> Vec<(f64, u64)> {
    stdout
        .lines()
        .filter(|l| l.starts_with("worker ") && l.contains(" acquired lock "))
        .map(|l| {
            let start = l.find("(+").expect("offset") + 2;
            let end = start + l[start..].find("s)").expect("offset end");
            let offset: f64 = l[start..end].parse().expect("offset number");
            let fence: u64 = l.rsplit(' ').next().unwrap().parse().expect("fence");
            (offset, fence)
        })
        .collect()
}

#[test]
fn demo_acquisitions_come_hold_apart() {
    let home = Home::new();
    let out = home.run(&["demo", "--workers", "3", "--hold", "300ms"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let acquisitions = demo_acquisitions(&out.stdout);
    assert_eq!(acquisitions.len(), 3, "{out:?}");
    for pair in acquisitions.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            gap >= 0.25,
            "gap {gap:.3}s is shorter than the hold: {}",
            out.stdout
        );
        assert!(pair[1].1 > pair[0].1, "fences increase: {}", out.stdout);
    }
    assert!(
        out.stdout.contains("gaps between consecutive acquisitions"),
        "{out:?}"
    );
}

#[test]
fn demo_on_the_memory_backend() {
    let home = Home::new();
    let out = home.run(&[
        "--backend",
        "memory://",
        "demo",
        "--workers",
        "4",
        "--hold",
        "100ms",
        "--key",
        "m",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let acquisitions = demo_acquisitions(&out.stdout);
    assert_eq!(acquisitions.len(), 4, "{out:?}");
    for pair in acquisitions.windows(2) {
        assert!(pair[1].0 - pair[0].0 >= 0.08, "{}", out.stdout);
    }
}

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

    let out = home.run(&[
        "--backend",
        &url,
        "run",
        "--key",
        "rk",
        "--no-wait",
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(out.stdout, "");

    let status = home.run(&["--backend", &url, "status", "rk", "--json"]);
    assert_eq!(status.code, Some(0), "{status:?}");
    assert_eq!(json_field(status.stdout.trim(), "backend"), "\"redis\"");
    assert_eq!(json_field(status.stdout.trim(), "fence"), fence.to_string());

    holder.signal(libc::SIGTERM);
    assert_eq!(holder.wait(TIMEOUT).code, Some(128 + libc::SIGTERM));
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
    use distlock::testkit::zookeeper::ZooKeeperServer;
    let server = ZooKeeperServer::start().expect("ZooKeeper (apt-get install zookeeper)");
    let url = server.url();
    let home = Home::new();
    let (holder, fence) = home.hold(&["--backend", &url], "zk", &[]);
    let dump = server.four_letter("dump").unwrap();
    assert!(dump.contains("/lock/zk/_c_"), "Curator layout: {dump}");

    let busy = home.run(&[
        "--backend",
        &url,
        "run",
        "--key",
        "zk",
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(busy.code, Some(75), "{busy:?}");
    let status = home.run(&["--backend", &url, "status", "zk", "--json"]);
    assert_eq!(status.code, Some(0), "{status:?}");
    assert_eq!(json_field(status.stdout.trim(), "backend"), "\"zookeeper\"");
    assert_eq!(json_field(status.stdout.trim(), "fence"), fence.to_string());

    let dir = home.path("inside-zk");
    let dir = dir.to_str().unwrap();
    let procs: Vec<Proc> = (0..4)
        .map(|_| {
            Proc::spawn(&mut home.cmd(&[
                "--backend",
                &url,
                "run",
                "--key",
                "zk",
                "--",
                "sh",
                "-c",
                r#"mkdir "$1" || exit 99; sleep 0.1; rmdir "$1"; printf %s "$DISTLOCK_FENCE""#,
                "sh",
                dir,
            ]))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    holder.signal(libc::SIGTERM);
    assert_eq!(holder.wait(TIMEOUT).code, Some(128 + libc::SIGTERM));
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

#[test]
fn redis_prefix_names_the_key() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let home = Home::new();
    let (holder, _) = home.hold(&["--backend", &url, "--prefix", "billing"], "v", &[]);
    assert_eq!(server.cli(&["EXISTS", "billing:v"]).unwrap(), "1");
    drop(holder);
}

#[test]
fn lost_lock_terminates_the_command_and_exits_76() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let home = Home::new();
    let (holder, _) = home.hold(&["--backend", &url], "lost", &["--lease", "300ms"]);
    let child_pid = read_pid(&home, "lost");
    assert_eq!(server.cli(&["DEL", "lock:lost"]).unwrap(), "1");
    let deleted = Instant::now();
    let out = holder.wait(Duration::from_secs(10));
    assert_eq!(out.code, Some(76), "{out:?}");
    // SIGTERM ends `sleep` at once, well before the 5 s grace period.
    assert!(deleted.elapsed() < Duration::from_secs(4), "{out:?}");
    assert!(one_stderr_line(&out).contains("lost"), "{out:?}");
    assert!(!process_exists(child_pid), "the command was stopped");
}

#[test]
fn lost_lock_kills_a_command_that_ignores_sigterm() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let home = Home::new();
    let marker = home.path("stubborn");
    let mut proc = Proc::spawn(
        home.cmd(&[
            "--backend",
            &url,
            "run",
            "--key",
            "stubborn",
            "--lease",
            "300ms",
            "--",
            "sh",
            "-c",
            r#"trap '' TERM; touch "$1"; while :; do sleep 0.05; done"#,
            "sh",
            marker.to_str().unwrap(),
        ])
        .env("DISTLOCK_KILL_GRACE", "700"),
    );
    wait_for_file(&marker, &mut proc);
    assert_eq!(server.cli(&["DEL", "lock:stubborn"]).unwrap(), "1");
    let deleted = Instant::now();
    let out = proc.wait(Duration::from_secs(10));
    assert_eq!(out.code, Some(76), "{out:?}");
    let took = deleted.elapsed();
    assert!(
        took >= Duration::from_millis(700),
        "SIGKILL only after the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Mutual exclusion between `distlock` processes through a SQL server: a holder, a `--no-wait`
/// run that gets 75, `status` with the fence, release on SIGTERM, then four waiting runs that
/// never overlap. `rows` counts the live rows of the lease table.
fn sql_mutual_exclusion(url: &str, kind: &str, rows: impl Fn() -> usize) {
    let home = Home::new();
    let (holder, fence) = home.hold(&["--backend", url], "sk", &[]);
    assert_eq!(rows(), 1, "the lock is a row of the lease table");
    let out = home.run(&[
        "--backend",
        url,
        "run",
        "--key",
        "sk",
        "--no-wait",
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(out.stdout, "");
    let status = home.run(&["--backend", url, "status", "sk", "--json"]);
    assert_eq!(status.code, Some(0), "{status:?}");
    assert_eq!(
        json_field(status.stdout.trim(), "backend"),
        format!("\"{kind}\"")
    );
    assert_eq!(json_field(status.stdout.trim(), "fence"), fence.to_string());
    holder.signal(libc::SIGTERM);
    assert_eq!(holder.wait(TIMEOUT).code, Some(128 + libc::SIGTERM));
    assert_eq!(rows(), 0, "released on the server");
    let status = home.run(&["--backend", url, "status", "sk"]);
    assert_eq!(status.code, Some(3), "{status:?}");

    let dir = home.path("inside");
    let dir = dir.to_str().unwrap();
    let procs: Vec<Proc> = (0..4)
        .map(|_| {
            Proc::spawn(&mut home.cmd(&[
                "--backend",
                url,
                "run",
                "--key",
                "sk",
                "--wait",
                "15s",
                "--",
                "sh",
                "-c",
                r#"mkdir "$1" || exit 99; sleep 0.2; rmdir "$1""#,
                "sh",
                dir,
            ]))
        })
        .collect();
    for p in procs {
        let out = p.wait(TIMEOUT);
        assert_eq!(out.code, Some(0), "overlap or failure: {out:?}");
    }
}

#[test]
fn postgres_mutual_exclusion() {
    use distlock::testkit::postgres::PostgresServer;
    let server = PostgresServer::machine_or_start()
        .expect("PostgreSQL must run or be installed (apt-get install postgresql)");
    let db = server.fresh_database().expect("fresh database");
    let url = format!("{}?table=cli_locks", db.url());
    sql_mutual_exclusion(&url, "postgres", || {
        db.query("SELECT count(*) FROM cli_locks WHERE token IS NOT NULL")
            .expect("count")[0][0]
            .as_deref()
            .expect("a count")
            .parse()
            .expect("a number")
    });
}

#[test]
fn mysql_mutual_exclusion() {
    use distlock::testkit::mysql::MariaDbServer;
    let server = MariaDbServer::machine_or_start()
        .expect("MariaDB must run or be installed (apt-get install mariadb-server)");
    let db = server.fresh_database().expect("fresh database");
    let url = db.url().to_owned();
    sql_mutual_exclusion(&url, "mysql", || {
        db.query("SELECT COUNT(*) FROM distlock_locks WHERE token IS NOT NULL")
            .expect("count")[0][0]
            .as_deref()
            .expect("a count")
            .parse()
            .expect("a number")
    });
}

/// `etcd://` across processes: the `concurrency.Mutex` layout on the server (`lock/sk/<lease>`),
/// a busy run exits 75, `status` sees the holder's fence, SIGTERM releases, and waiting runs
/// never overlap.
#[test]
fn etcd_mutual_exclusion() {
    use distlock::testkit::etcd::EtcdServer;
    let server = EtcdServer::start().expect("etcd (apt-get install etcd-server)");
    sql_mutual_exclusion(&server.url(), "etcd", || {
        server
            .etcdctl(&["get", "--prefix", "lock/sk/", "--keys-only"])
            .expect("etcdctl get")
            .lines()
            .filter(|l| l.starts_with("lock/sk/"))
            .count()
    });
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

// ---------------------------------------------------------------------------------------------
// CMD's process group (issue 9)

/// True while `pid` exists and is not a zombie (a zombie runs nothing; its reaper may be slow).
fn running(pid: libc::pid_t) -> bool {
    if !process_exists(pid) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next()),
            Some("Z" | "X")
        ),
        Err(_) => false,
    }
}

/// The pids in a file written by a test's CMD, one or more per line.
fn read_pids(path: &Path) -> Vec<libc::pid_t> {
    std::fs::read_to_string(path)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect()
}

/// Kills what a failed test left running.
struct KillOnDrop(Vec<libc::pid_t>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if running(pid) {
                // SAFETY: kill(2) on a process the test started (through distlock).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// Polls `done` every 10 ms for at most `bound`; true if it became true.
fn eventually(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CMD writes its pid and that of a background job, then waits for the job.
const SH_WITH_A_BACKGROUND_JOB: &str =
    r#"sleep 1000 & echo "$$ $!" > "$1.tmp"; mv "$1.tmp" "$1"; wait"#;

#[test]
fn a_lost_lock_stops_the_commands_whole_process_group() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let home = Home::new();
    let pids = home.path("pids");
    let mut proc = Proc::spawn(&mut home.cmd(&[
        "--backend",
        &url,
        "run",
        "--key",
        "grp",
        "--lease",
        "1s",
        "--",
        "sh",
        "-c",
        SH_WITH_A_BACKGROUND_JOB,
        "sh",
        pids.to_str().unwrap(),
    ]));
    wait_for_file(&pids, &mut proc);
    let group = KillOnDrop(read_pids(&pids));
    assert!(group.0.iter().all(|&p| running(p)), "{:?}", group.0);
    assert_eq!(server.cli(&["DEL", "lock:grp"]).unwrap(), "1");
    let out = proc.wait(TIMEOUT);
    assert_eq!(out.code, Some(76), "{out:?}");
    // distlock reaps the whole group before it exits: not even a zombie is left.
    let alive: Vec<_> = group.0.iter().filter(|&&p| process_exists(p)).collect();
    assert!(
        alive.is_empty(),
        "still there after exit 76: {alive:?} {out:?}"
    );
}

#[test]
fn killing_distlock_kills_the_commands_whole_process_group() {
    let home = Home::new();
    let pids = home.path("pids");
    let mut proc = Proc::spawn(&mut home.cmd(&[
        "run",
        "--key",
        "die",
        "--",
        "sh",
        "-c",
        SH_WITH_A_BACKGROUND_JOB,
        "sh",
        pids.to_str().unwrap(),
    ]));
    wait_for_file(&pids, &mut proc);
    let group = KillOnDrop(read_pids(&pids));
    assert_eq!(group.0.len(), 2);
    proc.signal(libc::SIGKILL);
    let out = proc.wait(TIMEOUT);
    assert_eq!(out.code, None, "killed: {out:?}");
    // The watcher acts on end-of-file at once; the bound only absorbs a loaded machine.
    let gone = eventually(Duration::from_secs(10), || {
        group.0.iter().all(|&p| !running(p))
    });
    assert!(gone, "CMD's group outlived distlock: {:?}", group.0);
}

/// Renewals stall (a partition between distlock and Redis): the group must be gone, SIGKILL
/// included, when the lock can be taken again on the server. No clock race: the check happens
/// at the moment a second client's `SET NX` succeeds. With a 5 s lease the margin is 500 ms
/// and the 500 ms grace fits: SIGTERM at 1 s left, SIGKILL at 500 ms left.
#[test]
fn failing_renewals_stop_the_group_before_the_lease_ends_on_the_server() {
    use distlock::testkit::proxy::FaultProxy;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start().expect("redis-server");
    let proxy = rt.block_on(FaultProxy::start(server.addr())).unwrap();
    let url = format!("redis://{}", proxy.addr());
    let home = Home::new();
    let pids = home.path("pids");
    // Everything in the group ignores SIGTERM: only SIGKILL ends it.
    let mut proc = Proc::spawn(
        home.cmd(&[
            "--backend",
            &url,
            "run",
            "--key",
            "ov",
            "--lease",
            "5s",
            "--",
            "sh",
            "-c",
            &format!("trap '' TERM; {SH_WITH_A_BACKGROUND_JOB}"),
            "sh",
            pids.to_str().unwrap(),
        ])
        .env("DISTLOCK_KILL_GRACE", "500"),
    );
    wait_for_file(&pids, &mut proc);
    let group = KillOnDrop(read_pids(&pids));
    assert_eq!(server.cli(&["EXISTS", "lock:ov"]).unwrap(), "1");
    proxy.pause();
    let started = Instant::now();
    loop {
        let taken = server
            .cli(&["SET", "lock:ov", "next-holder", "NX", "PX", "60000"])
            .unwrap();
        if taken == "OK" {
            break;
        }
        assert!(started.elapsed() < TIMEOUT, "the lease never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    let alive: Vec<_> = group.0.iter().filter(|&&p| process_exists(p)).collect();
    proxy.cut();
    let out = proc.wait(TIMEOUT);
    assert!(
        alive.is_empty(),
        "processes of the first holder's group alive when the next holder got the lock: \
         {alive:?} {out:?}"
    );
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(
        one_stderr_line(&out).contains("about to be lost"),
        "{out:?}"
    );
    drop(proxy);
}

#[test]
fn a_terminal_ctrl_c_reaches_the_command_once_and_it_can_read_the_terminal() {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let home = Home::new();
    let dir = home.dir.path().to_str().unwrap().to_owned();
    let script = r#"
        n=0
        trap 'n=$((n+1)); echo $n > "$1/ints"' INT
        cat /proc/$$/stat > "$1/stat"
        touch "$1/ready"
        while [ ! -e "$1/go" ]; do sleep 0.05; done
        read line
        echo "line=$line ints=$n" > "$1/out.tmp"; mv "$1/out.tmp" "$1/out"
    "#;
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let mut cmd = home.cmd(&["run", "--key", "tty", "--", "sh", "-c", script, "sh", &dir]);
    cmd.stdin(Stdio::from(pty.slave.try_clone().unwrap()))
        .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(Stdio::from(pty.slave.try_clone().unwrap()));
    // SAFETY: setsid and ioctl are async-signal-safe; the terminal becomes distlock's
    // controlling terminal, with distlock's group in the foreground, as in an interactive shell.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn distlock");
    drop(cmd);
    drop(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let mut reader = master.try_clone().unwrap();
    let echoed = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = reader.read_to_end(&mut all); // ends with EIO once every slave fd is closed
        String::from_utf8_lossy(&all).into_owned()
    });
    let _guard = scopeguard_kill(&child);
    let wait_for = |name: &str, child: &mut Child| {
        let path = home.path(name);
        let ok = eventually(TIMEOUT, || {
            path.exists() || child.try_wait().ok().flatten().is_some()
        });
        assert!(ok && path.exists(), "no {name}");
    };
    wait_for("ready", &mut child);
    master.write_all(&[0x03]).unwrap(); // Ctrl-C
    wait_for("ints", &mut child);
    // A second delivery (distlock forwarding what the terminal already sent) would come at once.
    std::thread::sleep(Duration::from_millis(500));
    // Ctrl-Z stops CMD's group; distlock follows it (here, as the leader of an orphaned group,
    // the kernel continues it at once, as POSIX says) and continues CMD: nothing stays stuck.
    master.write_all(&[0x1a]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(home.path("go"), "").unwrap();
    master.write_all(b"hello\n").unwrap();
    let finished = eventually(TIMEOUT, || child.try_wait().ok().flatten().is_some());
    if !finished {
        let _ = child.kill();
        let _ = child.wait();
        panic!("CMD did not finish: stopped (SIGTTIN on its read, or Ctrl-Z not followed)?");
    }
    let status = child.wait().unwrap();
    drop(master);
    let out = std::fs::read_to_string(home.path("out")).unwrap_or_default();
    let terminal = echoed.join().unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{out:?} {terminal:?}");
    assert_eq!(out.trim(), "line=hello ints=1", "terminal: {terminal:?}");

    // Why exactly once: CMD leads a process group of its own, and that group, not distlock's,
    // is the terminal's foreground group (so the terminal signals CMD and never distlock).
    let stat = std::fs::read_to_string(home.path("stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let (pgrp, tpgid): (i64, i64) = (fields[2].parse().unwrap(), fields[5].parse().unwrap());
    let sh: i64 = stat.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(pgrp, sh, "CMD leads its own group: {stat}");
    assert_ne!(pgrp, i64::from(child.id()), "not distlock's group: {stat}");
    assert_eq!(tpgid, pgrp, "CMD's group has the terminal: {stat}");
}

/// Kills the child if the test fails before it ended.
fn scopeguard_kill(child: &Child) -> KillOnDrop {
    KillOnDrop(vec![libc::pid_t::try_from(child.id()).unwrap()])
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

/// `etcds://` from the command line: the same as [`etcd_mutual_exclusion`] over TLS, with the
/// server's private authority named by `ca_file`; without it the server is not trusted.
#[test]
fn etcds_mutual_exclusion() {
    use distlock::testkit::etcd::{EtcdServer, EtcdServerOptions, TlsFiles};
    let certs = distlock::testkit::tls::TestCa::new(&["localhost", "127.0.0.1"], "distlock")
        .expect("openssl");
    let d = certs.dir();
    let server = EtcdServer::start_with(EtcdServerOptions {
        tls: Some(TlsFiles {
            cert: d.join("server.crt"),
            key: d.join("server.key"),
            ca: d.join("ca.crt"),
        }),
        ..EtcdServerOptions::default()
    })
    .expect("etcd with TLS (apt-get install etcd-server)");
    assert!(server.url().starts_with("etcds://"), "{}", server.url());

    let home = Home::new();
    let untrusted = home.run(&["--backend", &server.url(), "status", "sk"]);
    assert_eq!(untrusted.code, Some(1), "{untrusted:?}");
    assert_eq!(untrusted.stderr.trim().lines().count(), 1, "{untrusted:?}");

    let url = format!("{}?ca_file={}", server.url(), d.join("ca.crt").display());
    sql_mutual_exclusion(&url, "etcd", || {
        server
            .etcdctl(&["get", "--prefix", "lock/sk/", "--keys-only"])
            .expect("etcdctl get")
            .lines()
            .filter(|l| l.starts_with("lock/sk/"))
            .count()
    });
}
