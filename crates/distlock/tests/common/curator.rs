//! Real Apache Curator for the ZooKeeper interop tests: Debian's `libcurator-recipes-java`
//! (Curator 5.4) on the JDK runs `tests/curator/CuratorHold.java`, which takes one lock with
//! Curator's own recipes, reports on stdout and holds it until a line arrives on stdin, and
//! `tests/curator/CuratorLatch.java`, one participant of a `LeaderLatch` election.
//! Missing Java or jars fail the test loudly (`scripts/test.sh` installs them).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::mpsc;

/// Curator's recipes; its manifest's `Class-Path` brings the framework, client, ZooKeeper,
/// Guava and SLF4J jars of `/usr/share/java`.
pub const RECIPES_JAR: &str = "/usr/share/java/curator-recipes.jar";
/// SLF4J's no-op binding (package `libslf4j-java`), so Curator logs nothing.
pub const SLF4J_NOP_JAR: &str = "/usr/share/java/slf4j-nop.jar";

/// How long a JVM may take to start, connect and answer: a hang guard, not a measurement.
pub const JVM_LIMIT: Duration = Duration::from_secs(90);

/// `CuratorHold` and `CuratorLatch` compiled once per test process into a directory of its own.
fn classes() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        for jar in [RECIPES_JAR, SLF4J_NOP_JAR] {
            assert!(
                Path::new(jar).exists(),
                "{jar} is missing: install libcurator-recipes-java and libslf4j-java \
                 (scripts/test.sh does)"
            );
        }
        let dir = std::env::temp_dir().join(format!(
            "distlock-curator-{}-{:x}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the compiled fixture");
        let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/curator");
        let out = Command::new("javac")
            .args(["-cp", RECIPES_JAR, "-d"])
            .arg(&dir)
            .arg(sources.join("CuratorHold.java"))
            .arg(sources.join("CuratorLatch.java"))
            .output()
            .expect("javac must be installed (the JDK; scripts/test.sh installs it)");
        assert!(
            out.status.success(),
            "javac in {} failed: {}",
            sources.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

fn rand_suffix() -> u64 {
    distlock::Token::random().as_u128() as u64
}

/// One `CuratorHold` process: a Curator client that takes one lock.
pub struct Curator {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    what: String,
}

impl Curator {
    /// Starts a Curator client on `connect` that takes `mode` (`read`, `write`, `mutex`,
    /// `sem:N`) at `path`, waiting at most `timeout`, and waits until it is connected.
    pub async fn start(connect: &str, mode: &str, path: &str, timeout: Duration) -> Curator {
        let args = [connect, mode, path, &timeout.as_millis().to_string()];
        Self::run("CuratorHold", &args, format!("Curator {mode} at {path}")).await
    }

    /// Starts a `LeaderLatch` participant with `id` on the election at `path` and waits until
    /// it is connected; it prints `leading` when it leads (see `CuratorLatch.java`).
    pub async fn latch(connect: &str, path: &str, id: &str) -> Curator {
        let what = format!("Curator's LeaderLatch {id} at {path}");
        Self::run("CuratorLatch", &[connect, path, id], what).await
    }

    async fn run(class: &str, args: &[&str], what: String) -> Curator {
        let classpath = format!("{RECIPES_JAR}:{SLF4J_NOP_JAR}:{}", classes().display());
        let mut child = Command::new("java")
            .args([
                "-Xmx64m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(&classpath)
            .arg(class)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("java must be installed (scripts/test.sh installs the JDK)");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut c = Curator {
            child,
            stdin,
            lines,
            what,
        };
        c.expect("connected", JVM_LIMIT).await;
        c
    }

    /// The next line it prints, within `limit`.
    pub async fn line(&mut self, limit: Duration) -> String {
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("{} exited: {:?}", self.what, self.child.wait()),
            Err(_) => panic!("{} said nothing within {limit:?}", self.what),
        }
    }

    async fn expect(&mut self, want: &str, limit: Duration) {
        let got = self.line(limit).await;
        assert_eq!(got, want, "{}", self.what);
    }

    /// Whether it acquired (`true`) or gave up after its timeout (`false`).
    pub async fn outcome(&mut self) -> bool {
        match self.line(JVM_LIMIT).await.as_str() {
            "acquired" => true,
            "busy" => false,
            other => panic!("{}: unexpected {other:?}", self.what),
        }
    }

    /// Whether it has said nothing more so far (still waiting for its lock).
    pub fn waiting(&mut self) -> bool {
        matches!(self.lines.try_recv(), Err(mpsc::error::TryRecvError::Empty))
    }

    /// Sends it one command line.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to Curator");
        stdin.flush().expect("flush to Curator");
    }

    /// The leader's id as its `LeaderLatch.getLeader()` reads it (empty when nobody leads).
    pub async fn leader(&mut self) -> String {
        self.send("leader");
        let line = self.line(JVM_LIMIT).await;
        match line.strip_prefix("leader ") {
            Some(id) => id.to_owned(),
            None if line == "leader" => String::new(),
            None => panic!("{}: unexpected {line:?}", self.what),
        }
    }

    /// Leaves the election (a `CuratorLatch`) and waits for the process to end.
    pub async fn close(mut self) {
        self.send("close");
        self.expect("closed", JVM_LIMIT).await;
        let status = self.child.wait().expect("wait for Curator");
        assert!(status.success(), "{} ended with {status}", self.what);
    }

    /// Lets go of the lock it holds and waits for the process to end.
    pub async fn release(mut self) {
        let mut stdin = self.stdin.take().expect("stdin");
        stdin.write_all(b"release\n").expect("write to Curator");
        drop(stdin);
        self.expect("released", JVM_LIMIT).await;
        let status = self.child.wait().expect("wait for Curator");
        assert!(status.success(), "{} ended with {status}", self.what);
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
