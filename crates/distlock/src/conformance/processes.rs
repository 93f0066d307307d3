//! Scenarios across OS processes. The children are this test binary started again with
//! `<module>::<scenario> --exact` and the `DISTLOCK_CONFORMANCE_*` variables set: the generated
//! test sees them ([`run_child_if_asked`]) and plays the child instead of building a harness.
//! Children connect with the harness's URL and talk to the parent through files in a
//! temporary directory, so no clock is shared: a child that enters the critical section
//! creates a marker file with `create_new` (which fails if another holder is inside), and
//! increments a counter file under the lock.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::Harness;
use crate::{LockRegistry, RegistryOptions};

const ROLE: &str = "DISTLOCK_CONFORMANCE_CHILD";
const URL: &str = "DISTLOCK_CONFORMANCE_URL";
const PREFIX: &str = "DISTLOCK_CONFORMANCE_PREFIX";
const DIR: &str = "DISTLOCK_CONFORMANCE_DIR";
const INDEX: &str = "DISTLOCK_CONFORMANCE_INDEX";
const ROUNDS: &str = "DISTLOCK_CONFORMANCE_ROUNDS";

/// How long a child may take, from its start to its exit.
const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// Child processes of one scenario, killed if the scenario fails before they exit.
struct Children {
    dir: crate::testkit::TempDir,
    children: Vec<(usize, Child)>,
}

impl Children {
    fn new() -> Self {
        Children {
            dir: crate::testkit::TempDir::new("distlock-conformance")
                .expect("a temporary directory"),
            children: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts child `index` playing `role` on `h`'s backend.
    fn spawn(&mut self, h: &Harness, role: &str, index: usize, rounds: usize) {
        let url = h
            .url()
            .expect("cross-process scenarios need Harness::connect");
        let test = h
            .test_path
            .as_deref()
            .expect("cross-process scenarios run from conformance_suite!");
        let exe = std::env::current_exe().expect("the test binary's path");
        let log = std::fs::File::create(self.path(&format!("log-{index}"))).expect("log file");
        let child = Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(URL, url)
            .env(PREFIX, h.prefix())
            .env(DIR, self.dir.path())
            .env(INDEX, index.to_string())
            .env(ROUNDS, rounds.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start a child process");
        self.children.push((index, child));
    }

    /// Waits for every child to exit, and asserts that each succeeded.
    async fn wait_all(&mut self) {
        let deadline = Instant::now() + CHILD_LIMIT;
        for (index, child) in &mut self.children {
            let status = loop {
                if let Some(status) = child.try_wait().expect("wait for a child") {
                    break status;
                }
                assert!(
                    Instant::now() < deadline,
                    "child {index} still running after {CHILD_LIMIT:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let log = std::fs::read_to_string(self.dir.path().join(format!("log-{index}")))
                .unwrap_or_default();
            assert!(status.success(), "child {index} failed ({status}):\n{log}");
        }
        self.children.clear();
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `path` exists.
async fn appears(path: &Path, what: &str) {
    let deadline = Instant::now() + CHILD_LIMIT;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{what}: not after {CHILD_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn touch(path: &Path) {
    std::fs::write(path, b"").expect("write a file");
}

/// Several processes, each with its own connection, take one lock in turns: no two are ever
/// inside at once, no increment of a shared counter file is lost, and where the backend
/// fences, the fences strictly increase in the order the holders entered.
pub async fn mutual_exclusion_across_processes(h: &Harness) {
    let (processes, rounds) = (4, 10);
    let mut children = Children::new();
    std::fs::write(children.path("counter"), b"0").unwrap();
    for i in 0..processes {
        children.spawn(h, "exclusion", i, rounds);
    }
    for i in 0..processes {
        appears(&children.path(&format!("ready-{i}")), "child ready").await;
    }
    touch(&children.path("go"));
    children.wait_all().await;
    let counter = std::fs::read_to_string(children.path("counter")).unwrap();
    assert_eq!(
        counter.trim(),
        (processes * rounds).to_string(),
        "lost updates"
    );
    let mut entries: Vec<(u64, u64)> = Vec::new();
    for i in 0..processes {
        let out = std::fs::read_to_string(children.path(&format!("out-{i}"))).unwrap();
        for line in out.lines() {
            let (seq, fence) = line.split_once(' ').expect("`seq fence`");
            entries.push((seq.parse().unwrap(), fence.parse().unwrap()));
        }
    }
    entries.sort();
    let seqs: Vec<u64> = entries.iter().map(|e| e.0).collect();
    let all: Vec<u64> = (0..(processes * rounds) as u64).collect();
    assert_eq!(seqs, all, "every entry sees its own counter value");
    if h.capabilities().await.fences() {
        assert!(
            entries.windows(2).all(|w| w[1].1 > w[0].1),
            "fences not increasing in entry order: {entries:?}"
        );
    }
}

/// Processes, each with its own connection, queue one after another on a lock another
/// connection holds, and are served in the order they queued.
pub async fn remote_waiters_are_fifo(h: &Harness) {
    let processes = 4;
    // Time for a child's first attempt to reach the server once it says it is about to wait.
    let settle = h.limit(Duration::from_millis(300), 10).await;
    let holder = h.registry().await;
    let g = holder.obtain("queue").unwrap().lock().await.unwrap();
    let mut children = Children::new();
    for i in 0..processes {
        children.spawn(h, "fifo", i, 1);
        appears(&children.path(&format!("ready-{i}")), "child waiting").await;
        tokio::time::sleep(settle).await;
    }
    g.release().await.unwrap();
    children.wait_all().await;
    let order = std::fs::read_to_string(children.path("order")).unwrap();
    let order: Vec<usize> = order
        .split_whitespace()
        .map(|i| i.parse().unwrap())
        .collect();
    assert_eq!(
        order,
        (0..processes).collect::<Vec<_>>(),
        "served out of order"
    );
}

/// Reader and writer processes (and one taking the key's mutex) work on one key: a writer or
/// the mutex holder is never inside while anybody else is, which the children check through
/// marker files.
pub async fn kinds_exclude_each_other_across_processes(h: &Harness) {
    let mut children = Children::new();
    let roles = [
        "rw-reader",
        "rw-reader",
        "rw-writer",
        "rw-writer",
        "rw-mutex",
    ];
    for (i, role) in roles.iter().enumerate() {
        children.spawn(h, role, i, 6);
    }
    for i in 0..roles.len() {
        appears(&children.path(&format!("ready-{i}")), "child ready").await;
    }
    touch(&children.path("go"));
    children.wait_all().await;
}

/// Processes take permits of one semaphore: never more holders than permits at once.
pub async fn semaphore_admits_its_permits_across_processes(h: &Harness) {
    let mut children = Children::new();
    for i in 0..4 {
        children.spawn(h, "permit", i, 6);
    }
    for i in 0..4 {
        appears(&children.path(&format!("ready-{i}")), "child ready").await;
    }
    touch(&children.path("go"));
    children.wait_all().await;
}

/// A process killed while it holds a read lock and a semaphore permit frees both after its
/// lease: a writer and another permit taker get them then, and not at once.
pub async fn killed_holders_free_their_share_across_processes(h: &Harness) {
    let caps = h.capabilities().await;
    let mut children = Children::new();
    children.spawn(h, "crash-holder", 0, 1);
    appears(&children.path("held-0"), "child holds").await;
    for (_, child) in &mut children.children {
        child.kill().expect("kill the holder");
        let _ = child.wait();
    }
    children.children.clear();
    let reg = h.registry().await;
    let limit = h.limit(CRASH_LEASE * 3, 20).await;
    if caps.read_write {
        let rw = reg.read_write("crash").unwrap();
        assert!(
            rw.write().try_lock().await.is_err(),
            "the killed reader's share went at once, before its lease"
        );
        rw.write()
            .try_lock_for(limit)
            .await
            .expect("the killed reader's share outlived its lease")
            .release()
            .await
            .unwrap();
    }
    if caps.semaphores {
        let sem = reg.semaphore("crash-sem", 1).unwrap();
        sem.try_lock_for(limit)
            .await
            .expect("the killed holder's permit outlived its lease")
            .release()
            .await
            .unwrap();
    }
}

/// The lease of the holder that `killed_holders_free_their_share_across_processes` kills.
const CRASH_LEASE: Duration = Duration::from_secs(1);

/// Creates `path` as a marker of being inside; false when it already existed.
fn enter(path: &Path) -> bool {
    match std::fs::File::create_new(path) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => false,
        Err(e) => panic!("marker file: {e}"),
    }
}

/// The marker files in `dir` whose names start with `prefix`.
fn markers(dir: &Path, prefix: &str) -> usize {
    std::fs::read_dir(dir)
        .expect("read the scenario's directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .count()
}

/// In a child process started by a cross-process scenario, plays the child's part and returns
/// true; anywhere else returns false at once. The tests of
/// [`conformance_suite!`](crate::conformance_suite) call it first.
pub async fn run_child_if_asked() -> bool {
    let Ok(role) = std::env::var(ROLE) else {
        return false;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let dir = PathBuf::from(var(DIR));
    let index: usize = var(INDEX).parse().unwrap();
    let rounds: usize = var(ROUNDS).parse().unwrap();
    let backend = crate::connect(&var(URL)).await.expect("child connects");
    let reg =
        LockRegistry::from_backend(backend, RegistryOptions::default().with_prefix(var(PREFIX)))
            .expect("valid options");
    match role.as_str() {
        "exclusion" => {
            let lock = reg.obtain("xproc").unwrap();
            touch(&dir.join(format!("ready-{index}")));
            appears(&dir.join("go"), "go").await;
            let mut out = String::new();
            for _ in 0..rounds {
                let g = lock.lock().await.unwrap();
                let inside = dir.join("inside");
                match std::fs::File::create_new(&inside) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                        panic!("two processes hold the lock at once")
                    }
                    Err(e) => panic!("marker file: {e}"),
                }
                let counter = dir.join("counter");
                let seq: u64 = std::fs::read_to_string(&counter)
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                std::fs::write(&counter, (seq + 1).to_string()).unwrap();
                out.push_str(&format!("{seq} {}\n", g.fence()));
                std::fs::remove_file(&inside).unwrap();
                g.ensure_held().expect("held through the critical section");
                g.release().await.unwrap();
            }
            let tmp = dir.join(format!("out-{index}.tmp"));
            std::fs::write(&tmp, out).unwrap();
            std::fs::rename(tmp, dir.join(format!("out-{index}"))).unwrap();
        }
        "fifo" => {
            let lock = reg.obtain("queue").unwrap();
            touch(&dir.join(format!("ready-{index}")));
            let g = lock.lock().await.unwrap();
            let mut order = std::fs::read_to_string(dir.join("order")).unwrap_or_default();
            order.push_str(&format!("{index} "));
            std::fs::write(dir.join("order"), order).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
        }
        "rw-reader" | "rw-writer" | "rw-mutex" => {
            let rw = reg.read_write("xkinds").unwrap();
            let mutex = reg.obtain("xkinds").unwrap();
            touch(&dir.join(format!("ready-{index}")));
            appears(&dir.join("go"), "go").await;
            let mine = dir.join(format!("reader-{index}"));
            for _ in 0..rounds {
                if role == "rw-reader" {
                    let g = rw.read().lock().await.unwrap();
                    touch(&mine);
                    assert!(!dir.join("writer").exists(), "a reader beside a writer");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    assert!(!dir.join("writer").exists(), "a reader beside a writer");
                    std::fs::remove_file(&mine).unwrap();
                    g.ensure_held().expect("held through the critical section");
                    g.release().await.unwrap();
                } else {
                    let g = if role == "rw-writer" {
                        rw.write().lock().await.unwrap()
                    } else {
                        mutex.lock().await.unwrap()
                    };
                    assert!(enter(&dir.join("writer")), "two exclusive holders at once");
                    assert_eq!(
                        markers(&dir, "reader-"),
                        0,
                        "an exclusive holder beside readers"
                    );
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    assert_eq!(
                        markers(&dir, "reader-"),
                        0,
                        "an exclusive holder beside readers"
                    );
                    std::fs::remove_file(dir.join("writer")).unwrap();
                    g.ensure_held().expect("held through the critical section");
                    g.release().await.unwrap();
                }
            }
        }
        "permit" => {
            let sem = reg.semaphore("xsem", 2).unwrap();
            touch(&dir.join(format!("ready-{index}")));
            appears(&dir.join("go"), "go").await;
            let mine = dir.join(format!("holder-{index}"));
            for _ in 0..rounds {
                let g = sem.lock().await.unwrap();
                touch(&mine);
                let n = markers(&dir, "holder-");
                assert!(n <= 2, "{n} holders of 2 permits");
                tokio::time::sleep(Duration::from_millis(5)).await;
                std::fs::remove_file(&mine).unwrap();
                g.ensure_held().expect("held through the critical section");
                g.release().await.unwrap();
            }
        }
        "crash-holder" => {
            let reg = LockRegistry::from_backend(
                reg.backend().clone(),
                reg.options().clone().with_lease(CRASH_LEASE),
            )
            .expect("valid options");
            let caps = reg.backend().capabilities();
            let mut held = Vec::new();
            if caps.read_write {
                held.push(
                    reg.read_write("crash")
                        .unwrap()
                        .read()
                        .lock()
                        .await
                        .unwrap(),
                );
            }
            if caps.semaphores {
                held.push(reg.semaphore("crash-sem", 1).unwrap().lock().await.unwrap());
            }
            touch(&dir.join(format!("held-{index}")));
            // Held (and renewed) until the parent kills this process.
            tokio::time::sleep(CHILD_LIMIT).await;
            drop(held);
        }
        other => panic!("no child role {other:?}"),
    }
    true
}
