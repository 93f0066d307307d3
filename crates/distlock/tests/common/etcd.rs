//! Helpers shared by the etcd test binaries (`etcd`, `etcd_faults`): backends and registries
//! under a prefix of their own, the keys `etcdctl` sees, and `etcdctl lock` as a child process.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use distlock::backends::etcd::EtcdBackend;
use distlock::{Backend, LockRegistry, RegistryOptions};
use distlock_testkit::etcd::EtcdServer;
use tokio::time::Instant;

pub fn prefix() -> String {
    format!("t{:016x}", rand::random::<u64>())
}

/// The test process's shared etcd server, and a fresh prefix for the test's keys on it.
pub fn shared_server() -> (Arc<EtcdServer>, String) {
    (EtcdServer::shared().expect("etcd-server"), prefix())
}

pub async fn backend(url: &str) -> Arc<dyn Backend> {
    // `RUST_LOG=distlock=debug` shows what the backend does (nextest prints it on failure).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    Arc::new(EtcdBackend::connect(url).await.expect("connect to etcd"))
}

pub async fn registry(url: &str, prefix: &str, opts: RegistryOptions) -> LockRegistry {
    LockRegistry::from_backend(backend(url).await, opts.with_prefix(prefix)).unwrap()
}

/// One key as `etcdctl get -w fields` shows it.
#[derive(Debug, Clone)]
pub struct Kv {
    pub key: String,
    pub value: String,
    pub create_revision: i64,
    pub lease: i64,
}

/// The keys under `prefix`, in create-revision order.
pub fn keys(run: impl Fn(&[&str]) -> std::io::Result<String>, prefix: &str) -> Vec<Kv> {
    let out = run(&["get", "--prefix", prefix, "-w", "fields"]).expect("etcdctl get");
    let mut kvs = Vec::new();
    let mut cur: Option<Kv> = None;
    for line in out.lines() {
        let Some((name, value)) = line.split_once(" : ") else {
            continue;
        };
        let value = value.trim();
        let text = || value.trim_matches('"').to_owned();
        match name.trim().trim_matches('"') {
            "Key" => {
                kvs.extend(cur.take());
                cur = Some(Kv {
                    key: text(),
                    value: String::new(),
                    create_revision: 0,
                    lease: 0,
                });
            }
            "CreateRevision" => {
                if let Some(c) = cur.as_mut() {
                    c.create_revision = value.parse().unwrap();
                }
            }
            "Value" => {
                if let Some(c) = cur.as_mut() {
                    c.value = text();
                }
            }
            "Lease" => {
                if let Some(c) = cur.as_mut() {
                    c.lease = value.parse().unwrap();
                }
            }
            _ => {}
        }
    }
    kvs.extend(cur);
    kvs.sort_by_key(|k| k.create_revision);
    kvs
}

pub fn server_keys(server: &EtcdServer, prefix: &str) -> Vec<Kv> {
    keys(|a| server.etcdctl(a), prefix)
}

pub async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `etcdctl lock NAME [CMD...]` as a child process; its first output line is the lock key.
pub struct CtlLock {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl CtlLock {
    pub fn spawn(endpoint: &str, name: &str, cmd: &[&str]) -> CtlLock {
        let mut args = vec!["lock", "--ttl=5", name];
        args.extend_from_slice(cmd);
        Self::spawn_args(endpoint, &args)
    }

    /// `etcdctl ARGS` as a child process whose output lines are read as they come.
    pub fn spawn_args(endpoint: &str, args: &[&str]) -> CtlLock {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl must be installed (scripts/test.sh installs etcd-client)");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        CtlLock { child, lines }
    }

    pub fn line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }

    pub fn signal(&self, sig: i32) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(pid, sig) };
    }

    pub fn wait(mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "etcdctl lock did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for CtlLock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
