//! What the black-box tests of the `distlock` binary share: each test gets its own
//! `DISTLOCK_HOME`, so the default backend is a fresh SQLite file; every process is waited for
//! with a timeout and killed if it overstays. Each test file uses its own subset.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub const BIN: &str = env!("CARGO_BIN_EXE_distlock");
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// A fresh database on the machine's PostgreSQL server, or on a throwaway one.
pub fn fresh_postgres() -> distlock_testkit::postgres::TestDatabase {
    distlock_testkit::postgres::PostgresServer::machine_or_start()
        .expect("PostgreSQL (scripts/test.sh installs postgresql)")
        .fresh_database()
        .expect("fresh database")
}

/// A fresh database on the machine's MariaDB server, or on a throwaway one.
pub fn fresh_mariadb() -> distlock_testkit::mysql::TestDatabase {
    distlock_testkit::mysql::MariaDbServer::machine_or_start()
        .expect("MariaDB (scripts/test.sh installs mariadb-server)")
        .fresh_database()
        .expect("fresh database")
}

/// The first number of a query's answer, such as a `count(*)`.
pub fn first_number(rows: std::io::Result<Vec<Vec<Option<String>>>>) -> usize {
    rows.expect("count")[0][0]
        .as_deref()
        .expect("a count")
        .parse()
        .expect("a number")
}

/// A test's private home: the SQLite database lives here, and so do marker files.
pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Self {
        Home {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `distlock ARGS` with this home and a clean environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
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
    pub fn run(&self, args: &[&str]) -> Output {
        Proc::spawn(&mut self.cmd(args)).wait(TIMEOUT)
    }

    /// Starts `distlock [PRE...] run --key KEY [EXTRA...] -- sh -c 'write fence and pid; exec sleep 30'`
    /// and waits until the command runs. Returns the process and the fence it got.
    pub fn hold(&self, pre: &[&str], key: &str, extra: &[&str]) -> (Proc, u64) {
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

pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Waits until `path` exists and returns its content; fails if `proc` exits first.
pub fn wait_for_file(path: &Path, proc: &mut Proc) -> String {
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
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// A running `distlock` whose output is collected; killed on drop if still running.
pub struct Proc {
    pub child: Child,
    pub started: Instant,
    pub readers: Option<(JoinHandle<String>, JoinHandle<String>)>,
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
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

    pub fn signal(&self, sig: Signal) {
        let pid = i32::try_from(self.child.id()).unwrap();
        kill(Pid::from_raw(pid), sig).expect("kill(2) on our own child");
    }

    /// Waits at most `timeout` for the process to end; kills it and fails the test otherwise.
    pub fn wait(mut self, timeout: Duration) -> Output {
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

    pub fn finish(&mut self, status: std::process::ExitStatus) -> Output {
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
pub fn one_stderr_line(out: &Output) -> &str {
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one stderr line expected: {out:?}");
    assert!(lines[0].starts_with("distlock: "), "{out:?}");
    lines[0]
}

/// The raw text of `"field":value` in a flat JSON object.
pub fn json_field<'a>(json: &'a str, field: &str) -> &'a str {
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

pub fn process_exists(pid: i32) -> bool {
    // No signal: only checks for existence.
    kill(Pid::from_raw(pid), None).is_ok()
}

pub fn read_pid(marker_dir: &Home, key: &str) -> i32 {
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

/// True while `pid` exists and is not a zombie (a zombie runs nothing; its reaper may be slow).
pub fn running(pid: i32) -> bool {
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
pub fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect()
}

/// Kills what a failed test left running.
pub struct KillOnDrop(pub Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if running(pid) {
                // A process the test started (through distlock).
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// Polls `done` every 10 ms for at most `bound`; true if it became true.
pub fn eventually(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
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

/// Kills the child if the test fails before it ended.
pub fn scopeguard_kill(child: &Child) -> KillOnDrop {
    KillOnDrop(vec![i32::try_from(child.id()).unwrap()])
}

/// Starts `n` runs of `distlock [PRE...] run --key KEY [EXTRA...] -- sh -c SCRIPT sh DIR`. The
/// script is to `mkdir "$1"` (failing with 99 if it exists, that is, if another run is inside)
/// and `rmdir` it before it ends, so that any overlap of two commands makes one of them fail.
pub fn exclusive_runs(
    home: &Home,
    pre: &[&str],
    key: &str,
    extra: &[&str],
    script: &str,
    n: usize,
) -> Vec<Proc> {
    let dir = home.path(&format!("inside-{key}"));
    let dir = dir.to_str().unwrap().to_owned();
    (0..n)
        .map(|_| {
            let mut args: Vec<&str> = pre.to_vec();
            args.extend(["run", "--key", key]);
            args.extend(extra);
            args.extend(["--", "sh", "-c", script, "sh", &dir]);
            Proc::spawn(&mut home.cmd(&args))
        })
        .collect()
}

/// A `--no-wait` run of a key that is held exits 75 without running its command, and
/// `status --json` names the `kind` of backend and the holder's `fence`.
pub fn assert_busy(home: &Home, url: &str, key: &str, kind: &str, fence: u64) {
    let out = home.run(&[
        "--backend",
        url,
        "run",
        "--key",
        key,
        "--no-wait",
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(out.stdout, "");
    let status = home.run(&["--backend", url, "status", key, "--json"]);
    assert_eq!(status.code, Some(0), "{status:?}");
    assert_eq!(
        json_field(status.stdout.trim(), "backend"),
        format!("\"{kind}\"")
    );
    let shown: u64 = json_field(status.stdout.trim(), "fence").parse().unwrap();
    if kind == "redis" {
        // Redis records the latest fence issued for the key, and the refused `--no-wait`
        // attempt above took one too (see `LockInfo::fence`).
        assert!(
            shown >= fence,
            "status fence {shown} below the holder's {fence}"
        );
    } else {
        assert_eq!(shown, fence);
    }
}

/// SIGTERM to a holder ends it with 128 + SIGTERM (its command was killed, the lock released).
pub fn stop_holder(holder: Proc) {
    holder.signal(Signal::SIGTERM);
    assert_eq!(
        holder.wait(TIMEOUT).code,
        Some(128 + Signal::SIGTERM as i32)
    );
}
