//! etcd backend against real etcd servers (Debian `etcd-server` 3.4, and `etcdctl` from the
//! Debian package `etcd-client`): the `concurrency.Mutex` layout and `etcdctl lock` interop,
//! predecessor-only wake-ups and FIFO order, faults (server killed mid-hold, lease revoked
//! underneath, a waiter's key lost while it waits), a three-node cluster losing a follower and
//! its leader, authentication and TLS.
//!
//! Tests that do not stop their server share one per test process and keep apart by prefix.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::backends::etcd::{EtcdBackend, EtcdOptions};
use distlock::testkit::etcd::{EtcdCluster, EtcdServer};
use distlock::testkit::timing::scheduling_slack;
use distlock::testkit::tls::TestCa;
use distlock::{
    AcquireMode, Attempt, Backend, Error, LockGuard, LockName, LockRegistry, RegistryOptions, Token,
};
use tokio::time::Instant;

fn prefix() -> String {
    format!("t{:016x}", rand::random::<u64>())
}

async fn backend(url: &str) -> Arc<dyn Backend> {
    // `RUST_LOG=distlock=debug` shows what the backend does (nextest prints it on failure).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    Arc::new(EtcdBackend::connect(url).await.expect("connect to etcd"))
}

async fn registry(url: &str, prefix: &str, opts: RegistryOptions) -> LockRegistry {
    LockRegistry::from_backend(backend(url).await, opts.with_prefix(prefix)).unwrap()
}

/// One key as `etcdctl get -w fields` shows it.
#[derive(Debug, Clone)]
struct Kv {
    key: String,
    value: String,
    create_revision: i64,
    lease: i64,
}

/// The keys under `prefix`, in create-revision order.
fn keys(run: impl Fn(&[&str]) -> std::io::Result<String>, prefix: &str) -> Vec<Kv> {
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

fn server_keys(server: &EtcdServer, prefix: &str) -> Vec<Kv> {
    keys(|a| server.etcdctl(a), prefix)
}

async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `etcdctl lock NAME [CMD...]` as a child process; its first output line is the lock key.
struct CtlLock {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl CtlLock {
    fn spawn(endpoint: &str, name: &str, cmd: &[&str]) -> CtlLock {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .args(["lock", "--ttl=5", name])
            .args(cmd)
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

    fn line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }

    fn signal(&self, sig: i32) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(pid, sig) };
    }

    fn wait(mut self, limit: Duration) -> std::process::ExitStatus {
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

/// Named `etcd::…`, so that `-E 'test(/etcd/)'` selects them all.
mod etcd {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn layout_is_the_concurrency_mutex_one() {
        let server = EtcdServer::shared().expect("etcd-server");
        let p = prefix();
        let a = registry(&server.url(), &p, RegistryOptions::default()).await;
        let b = registry(&server.url(), &p, RegistryOptions::default()).await;
        let g = a.obtain("voucher:42").unwrap().lock().await.unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.obtain("voucher:42").unwrap().lock().await.unwrap() })
        };
        let dir = format!("{p}/voucher:42/");
        eventually("waiter's key", Duration::from_secs(5), || {
            server_keys(&server, &dir).len() == 2
        })
        .await;
        let kvs = server_keys(&server, &dir);
        for kv in &kvs {
            let id = kv.key.strip_prefix(&dir).expect("under <prefix>/<key>/");
            assert_eq!(
                id,
                format!("{:x}", kv.lease),
                "named after its lease, in hex"
            );
            assert_eq!(kv.value.len(), 32, "the owner token: {kv:?}");
        }
        assert_ne!(kvs[0].lease, kvs[1].lease, "one lease per backend instance");
        // The holder is the lowest create revision; the fence is derived from it.
        assert_eq!(g.fence() >> 10, kvs[0].create_revision as u64);
        let info = a
            .obtain("voucher:42")
            .unwrap()
            .inspect()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.fence, Some(kvs[0].create_revision as u64));
        assert!(info.remaining.is_some_and(|r| r > Duration::ZERO));
        g.release().await.unwrap();
        let g2 = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(g2.fence() >> 10, kvs[1].create_revision as u64);
        g2.release().await.unwrap();
        assert!(
            server_keys(&server, &dir).is_empty(),
            "released keys are deleted"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcdctl_lock_excludes_distlock_and_back() {
        let server = EtcdServer::shared().expect("etcd-server");
        let p = prefix();
        let name = format!("{p}/shared");
        let reg = registry(&server.url(), &p, RegistryOptions::default()).await;

        // etcdctl holds: distlock waits, and gets the lock once etcdctl lets go.
        let ctl = CtlLock::spawn(&server.endpoint(), &name, &[]);
        let key = ctl
            .line(Duration::from_secs(10))
            .expect("etcdctl lock acquired");
        assert!(key.starts_with(&format!("{name}/")), "{key}");
        let ctl_rev = server_keys(&server, &format!("{name}/"))[0].create_revision;
        assert!(matches!(
            reg.obtain("shared").unwrap().try_lock().await,
            Err(Error::NotAcquired { .. })
        ));
        let waiting = {
            let reg = reg.clone();
            tokio::spawn(async move { reg.obtain("shared").unwrap().lock().await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "distlock entered while etcdctl holds"
        );
        ctl.signal(libc::SIGINT);
        let g = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("distlock gets the lock after etcdctl")
            .unwrap();
        assert!(g.fence() >> 10 > ctl_rev as u64);
        let _ = ctl.wait(Duration::from_secs(5));

        // distlock holds: etcdctl waits until distlock releases.
        let ctl = CtlLock::spawn(&server.endpoint(), &name, &["echo", "inside"]);
        assert_eq!(
            ctl.line(Duration::from_millis(700)),
            None,
            "etcdctl entered"
        );
        let released = Instant::now();
        g.release().await.unwrap();
        let line = ctl
            .line(Duration::from_secs(10))
            .expect("etcdctl gets the lock");
        assert_eq!(line, "inside");
        assert!(released.elapsed() < Duration::from_secs(5));
        assert!(ctl.wait(Duration::from_secs(5)).success());
    }

    /// Waiters wake one at a time: a release wakes only the next in line (whose watch is on the
    /// released key), and the queue is served in arrival order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_waiter_watches_only_its_predecessor() {
        let server = EtcdServer::shared().expect("etcd-server");
        let url = server.url();
        let name = LockName::new(prefix(), "k").unwrap();
        let lease = Duration::from_secs(10);
        let (a, b, c) = (
            backend(&url).await,
            backend(&url).await,
            backend(&url).await,
        );
        let (ta, tb, tc) = (Token::random(), Token::random(), Token::random());
        let Attempt::Acquired { fence: fa } = a
            .acquire(&name, ta, lease, AcquireMode::Queue)
            .await
            .unwrap()
        else {
            panic!("free lock not acquired");
        };
        let mut subs = Vec::new();
        for (be, t) in [(&b, tb), (&c, tc)] {
            assert!(matches!(
                be.acquire(&name, t, lease, AcquireMode::Queue)
                    .await
                    .unwrap(),
                Attempt::Busy { .. }
            ));
            subs.push(be.subscribe(&name, t).await.unwrap());
            assert!(matches!(
                be.acquire(&name, t, lease, AcquireMode::Queue)
                    .await
                    .unwrap(),
                Attempt::Busy { .. }
            ));
        }
        let (mut sb, mut sc) = (subs.remove(0), subs.remove(0));
        assert!(a.release(&name, ta).await.unwrap().was_held);
        tokio::time::timeout(Duration::from_secs(2), sb.released())
            .await
            .expect("the next waiter is woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), sc.released())
                .await
                .is_err(),
            "the waiter behind it was woken too"
        );
        let Attempt::Acquired { fence: fb } = b
            .acquire(&name, tb, lease, AcquireMode::Queue)
            .await
            .unwrap()
        else {
            panic!("woken head did not get the lock");
        };
        assert!(matches!(
            c.acquire(&name, tc, lease, AcquireMode::Queue)
                .await
                .unwrap(),
            Attempt::Busy { .. }
        ));
        assert!(b.release(&name, tb).await.unwrap().was_held);
        tokio::time::timeout(Duration::from_secs(2), sc.released())
            .await
            .expect("the last waiter is woken");
        let Attempt::Acquired { fence: fc } = c
            .acquire(&name, tc, lease, AcquireMode::Queue)
            .await
            .unwrap()
        else {
            panic!("woken head did not get the lock");
        };
        assert!(fa < fb && fb < fc);
        assert!(c.release(&name, tc).await.unwrap().was_held);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_across_processes_are_served_in_arrival_order() {
        let server = EtcdServer::shared().expect("etcd-server");
        let p = prefix();
        let holder = registry(&server.url(), &p, RegistryOptions::default()).await;
        let g = holder.obtain("fifo").unwrap().lock().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let reg = registry(&server.url(), &p, RegistryOptions::default()).await;
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let g = reg.obtain("fifo").unwrap().lock().await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
                g.release().await.unwrap();
            }));
            let dir = format!("{p}/fifo/");
            eventually("queued", Duration::from_secs(5), || {
                server_keys(&server, &dir).len() == i + 2
            })
            .await;
        }
        g.release().await.unwrap();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    /// Two registries on one backend instance contend for the same key: the key name holds only
    /// the lease id, so the second contender gets a lease of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn registries_sharing_a_backend_instance_exclude_each_other() {
        let server = EtcdServer::shared().expect("etcd-server");
        let p = prefix();
        let shared = backend(&server.url()).await;
        let regs: Vec<LockRegistry> = (0..2)
            .map(|_| {
                LockRegistry::from_backend(
                    shared.clone(),
                    RegistryOptions::default().with_prefix(&p),
                )
                .unwrap()
            })
            .collect();
        let g = regs[0].obtain("same").unwrap().lock().await.unwrap();
        let waiting = {
            let r = regs[1].clone();
            tokio::spawn(async move { r.obtain("same").unwrap().lock().await.unwrap() })
        };
        let dir = format!("{p}/same/");
        eventually("second contender queued", Duration::from_secs(5), || {
            server_keys(&server, &dir).len() == 2
        })
        .await;
        let kvs = server_keys(&server, &dir);
        assert_ne!(kvs[0].key, kvs[1].key);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished());
        g.release().await.unwrap();
        let g2 = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
        g2.release().await.unwrap();

        let inside = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for r in &regs {
            for _ in 0..2 {
                let (r, inside, count) = (r.clone(), inside.clone(), count.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..10 {
                        let g = r.obtain("same").unwrap().lock().await.unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                        let v = count.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        count.store(v + 1, Ordering::SeqCst);
                        inside.store(false, Ordering::SeqCst);
                        g.release().await.unwrap();
                    }
                }));
            }
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 40);
    }

    /// A holder whose session lease is revoked underneath learns it at its next renewal, and the
    /// next holder gets a larger fence.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lease_revoked_underneath_is_lost() {
        let server = EtcdServer::shared().expect("etcd-server");
        let p = prefix();
        let short = RegistryOptions::default().with_lease(Duration::from_millis(900));
        let a = registry(&server.url(), &p, short).await;
        let b = registry(&server.url(), &p, RegistryOptions::default()).await;
        let g = a.obtain("rv").unwrap().lock().await.unwrap();
        let kv = server_keys(&server, &format!("{p}/rv/")).remove(0);
        let slack = scheduling_slack().await;
        server
            .etcdctl(&["lease", "revoke", &format!("{:x}", kv.lease)])
            .unwrap();
        let revoked = Instant::now();
        tokio::time::timeout(Duration::from_secs(2) + slack, g.lost())
            .await
            .expect("lost signal after the revocation");
        // At its next renewal: within a third of the lease, and never after the lease.
        assert!(
            revoked.elapsed() < Duration::from_millis(900) + slack,
            "told after {:?} (slack {slack:?})",
            revoked.elapsed()
        );
        assert!(matches!(g.ensure_held(), Err(Error::LockLost { .. })));
        let g2 = b
            .obtain("rv")
            .unwrap()
            .try_lock_for(Duration::from_secs(2))
            .await
            .unwrap();
        assert!(g2.fence() > g.fence());
        let f2 = g2.fence();
        g2.release().await.unwrap();
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        // The backend that lost its session takes a new one.
        let g3 = a
            .obtain("rv")
            .unwrap()
            .try_lock_for(Duration::from_secs(2))
            .await
            .unwrap();
        assert!(g3.fence() > f2);
        g3.release().await.unwrap();
    }

    /// The Jepsen case (etcd 3.4.3's lock): a waiter's key vanishes while it waits (its lease
    /// expired). When its predecessor goes, it must not report the lock acquired: it queues again,
    /// behind whoever came meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiter_whose_key_vanished_does_not_acquire() {
        let server = EtcdServer::shared().expect("etcd-server");
        let p = prefix();
        let dir = format!("{p}/j/");
        // The waiter relies on its watch alone (no polling) to show that the re-check is what
        // catches the lost key.
        let no_poll = RegistryOptions::default().with_max_poll_interval(Duration::from_secs(30));
        let h = registry(&server.url(), &p, RegistryOptions::default()).await;
        let w = registry(&server.url(), &p, no_poll).await;
        let c = registry(&server.url(), &p, RegistryOptions::default()).await;
        let gh = h.obtain("j").unwrap().lock().await.unwrap();
        let w_task = tokio::spawn(async move {
            let g = w.obtain("j").unwrap().lock().await.unwrap();
            (g, Instant::now())
        });
        eventually("waiter queued", Duration::from_secs(5), || {
            server_keys(&server, &dir).len() == 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let w_key = server_keys(&server, &dir)[1].key.clone();
        server.etcdctl(&["del", &w_key]).unwrap();
        let c_task = tokio::spawn(async move {
            let g = c.obtain("j").unwrap().lock().await.unwrap();
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(300)).await;
            (g, at)
        });
        eventually("third contender queued", Duration::from_secs(5), || {
            server_keys(&server, &dir).len() == 2
        })
        .await;
        gh.release().await.unwrap();
        let (gc, c_at) = tokio::time::timeout(Duration::from_secs(5), c_task)
            .await
            .unwrap()
            .unwrap();
        assert!(
            !w_task.is_finished(),
            "the waiter whose key vanished reported the lock acquired"
        );
        let c_fence = gc.fence();
        gc.release().await.unwrap();
        let (gw, w_at) = tokio::time::timeout(Duration::from_secs(5), w_task)
            .await
            .unwrap()
            .unwrap();
        assert!(w_at > c_at);
        assert!(gw.fence() > c_fence);
        let kvs = server_keys(&server, &dir);
        assert_eq!(kvs.len(), 1, "the waiter holds with a key of its own");
        assert_eq!(gw.fence() >> 10, kvs[0].create_revision as u64);
        gw.release().await.unwrap();
    }

    /// The server dies while a lock is held: the holder cannot renew and is told it lost the lock
    /// when its lease ends; after the restart (etcd keeps its data and revision) the next holder
    /// gets a larger fence.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_killed_mid_hold_and_restarted() {
        let server = EtcdServer::start().expect("etcd-server");
        let p = prefix();
        let opts = RegistryOptions::default().with_lease(Duration::from_secs(1));
        let a = registry(&server.url(), &p, opts.clone()).await;
        let g = a.obtain("crash").unwrap().lock().await.unwrap();
        let slack = scheduling_slack().await;
        let lease_left = g.remaining();
        server.kill();
        let killed = Instant::now();
        tokio::time::timeout(Duration::from_secs(3) + slack, g.lost())
            .await
            .expect("the holder learns that it cannot keep the lock");
        // By the end of its client-side lease at the latest.
        assert!(
            killed.elapsed() <= lease_left + slack,
            "told after {:?} (lease left {lease_left:?}, slack {slack:?})",
            killed.elapsed()
        );
        server.restart().unwrap();
        let b = registry(&server.url(), &p, opts).await;
        let g2 = b
            .obtain("crash")
            .unwrap()
            .try_lock_for(Duration::from_secs(10))
            .await
            .expect("the lock is free again after the restart");
        assert!(g2.fence() > g.fence());
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
        assert!(g2.is_held());
        g2.release().await.unwrap();
    }

    /// A backend that is dropped revokes its session: its keys go at once, not with the TTL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_backend_revokes_its_session() {
        let server = EtcdServer::shared().expect("etcd-server");
        let p = prefix();
        let dir = format!("{p}/gone/");
        let name = LockName::new(p.as_str(), "gone").unwrap();
        let b = EtcdBackend::connect(&server.url()).await.unwrap();
        assert!(matches!(
            b.acquire(
                &name,
                Token::random(),
                Duration::from_secs(30),
                AcquireMode::Try
            )
            .await
            .unwrap(),
            Attempt::Acquired { .. }
        ));
        assert_eq!(server_keys(&server, &dir).len(), 1);
        drop(b);
        eventually(
            "key deleted by the revocation",
            Duration::from_secs(3),
            || server_keys(&server, &dir).is_empty(),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn user_and_password() {
        let server = EtcdServer::start().expect("etcd-server");
        server.etcdctl(&["user", "add", "root:s3cret-pw"]).unwrap();
        server.etcdctl(&["auth", "enable"]).unwrap();
        let port = server.port();
        let url = format!("etcd://root:s3cret-pw@127.0.0.1:{port}?allow_insecure_auth=true");
        let p = prefix();
        let reg = registry(&url, &p, RegistryOptions::default()).await;
        let g = reg.obtain("auth").unwrap().lock().await.unwrap();
        let kvs = keys(
            |a| {
                let mut args = vec!["--user=root:s3cret-pw"];
                args.extend_from_slice(a);
                server.etcdctl(&args)
            },
            &format!("{p}/auth/"),
        );
        assert_eq!(kvs.len(), 1);
        g.release().await.unwrap();

        let err = EtcdBackend::connect(&format!(
            "etcd://root:wrong-pw@127.0.0.1:{port}?allow_insecure_auth=true"
        ))
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
        assert!(err.to_string().contains("authentication"), "{err}");
        assert!(!err.to_string().contains("wrong-pw"));
        assert!(!format!("{err:?}").contains("wrong-pw"));

        // Without credentials nothing can be locked.
        let anonymous = format!("etcd://127.0.0.1:{port}");
        let res = match EtcdBackend::connect(&anonymous).await {
            Err(e) => Err(e),
            Ok(b) => b
                .acquire(
                    &LockName::new(p.as_str(), "auth").unwrap(),
                    Token::random(),
                    Duration::from_secs(5),
                    AcquireMode::Try,
                )
                .await
                .map(|_| ()),
        };
        let err = res.expect_err("anonymous access refused");
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_urls_and_unreachable_servers() {
        for (url, part) in [
            ("etcd://", "host"),
            ("etcd://127.0.0.1:notaport", "port"),
            ("etcd://127.0.0.1:2379/some/path", "path"),
            ("etcd://127.0.0.1:2379?nosuch=1", "nosuch"),
        ] {
            let err = distlock::connect(url).await.unwrap_err();
            assert!(matches!(err, Error::InvalidConfig(_)), "{url}: {err:?}");
            assert!(err.to_string().contains(part), "{url}: {err}");
        }
        let port = distlock::testkit::free_port();
        let opts = EtcdOptions {
            connect_timeout: Duration::from_millis(500),
            ..EtcdOptions::default()
        };
        let started = Instant::now();
        let err = EtcdBackend::connect_with(
            &format!("etcd://u:pw@127.0.0.1:{port}?allow_insecure_auth=true"),
            opts,
        )
        .await
        .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        assert!(!err.to_string().contains("pw@"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    /// Three members on loopback: a follower stops (locks keep working), then the leader stops
    /// while a lock is held (never two holders at once; a holder that cannot renew is told).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_node_cluster_loses_a_follower_then_its_leader() {
        let cluster = EtcdCluster::start(3).expect("etcd-server");
        let url = cluster.url();
        let p = prefix();
        let opts = RegistryOptions::default().with_lease(Duration::from_secs(3));
        let a = registry(&url, &p, opts.clone()).await;
        let b = registry(&url, &p, opts).await;

        let leader = cluster.leader().unwrap();
        let follower = (leader + 1) % 3;
        cluster.kill(follower);
        let mut last = 0;
        for i in 0..6 {
            let reg = if i % 2 == 0 { &a } else { &b };
            let g = reg
                .obtain("c")
                .unwrap()
                .try_lock_for(Duration::from_secs(10))
                .await
                .expect("locks work without a follower");
            assert!(g.fence() > last);
            last = g.fence();
            g.release().await.unwrap();
        }
        cluster.restart(follower).unwrap();

        // Now the leader goes while `a` holds; `b` keeps trying.
        let ga = a.obtain("c").unwrap().lock().await.unwrap();
        let leader = cluster.leader().unwrap();
        let holder_a: Arc<Mutex<Option<LockGuard>>> = Arc::new(Mutex::new(Some(ga)));
        let violation = Arc::new(AtomicBool::new(false));
        let contender = {
            let (b, holder_a, violation) = (b.clone(), holder_a.clone(), violation.clone());
            tokio::spawn(async move {
                let lock = b.obtain("c").unwrap();
                loop {
                    match lock.try_lock_for(Duration::from_secs(1)).await {
                        Ok(g) => {
                            let a_held = holder_a
                                .lock()
                                .unwrap()
                                .as_ref()
                                .is_some_and(|g| g.is_held());
                            if a_held {
                                violation.store(true, Ordering::SeqCst);
                            }
                            return g;
                        }
                        Err(e) if e.is_retryable() => continue,
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        };
        cluster.kill(leader);
        let killed = Instant::now();
        // Watch a's guard for a while after the leader's death: it either keeps the lock (renewal
        // goes through the new leader) or is told it lost it before anybody else gets it.
        while killed.elapsed() < Duration::from_secs(5) && !contender.is_finished() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ga = holder_a.lock().unwrap().take().unwrap();
        println!(
            "after the leader's death: holder kept the lock: {}, contender done: {}",
            ga.is_held(),
            contender.is_finished()
        );
        if ga.is_held() {
            ga.release()
                .await
                .expect("the holder kept the lock through the election");
        } else {
            tokio::time::timeout(Duration::from_millis(100), ga.lost())
                .await
                .expect("a holder that cannot renew is told");
            drop(ga);
        }
        let gb = tokio::time::timeout(Duration::from_secs(20), contender)
            .await
            .expect("the lock is available again after the election")
            .unwrap();
        assert!(!violation.load(Ordering::SeqCst), "two holders at once");
        assert!(gb.fence() > last);
        last = gb.fence();
        gb.release().await.unwrap();
        cluster.restart(leader).unwrap();

        // Without a quorum nobody can renew: the holder is told when its lease ends, and once a
        // quorum is back the next holder gets a larger fence.
        let ga = a.obtain("c").unwrap().lock().await.unwrap();
        let (x, y) = (
            cluster.leader().unwrap(),
            (cluster.leader().unwrap() + 1) % 3,
        );
        let slack = scheduling_slack().await;
        let lease_left = ga.remaining();
        cluster.kill(x);
        cluster.kill(y);
        let cut = Instant::now();
        tokio::time::timeout(Duration::from_secs(6) + slack, ga.lost())
            .await
            .expect("a holder that cannot renew is told");
        assert!(
            cut.elapsed() <= lease_left + slack,
            "told after {:?} (lease left {lease_left:?}, slack {slack:?})",
            cut.elapsed()
        );
        drop(ga);
        cluster.restart(x).unwrap();
        let gb = b
            .obtain("c")
            .unwrap()
            .try_lock_for(Duration::from_secs(20))
            .await
            .expect("the lock is free once a quorum is back");
        assert!(gb.fence() > last);
        gb.release().await.unwrap();
    }

    #[cfg(feature = "etcd-tls")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_with_a_private_ca() {
        use distlock::testkit::etcd::{EtcdServerOptions, TlsFiles};
        let certs = TestCa::new(&["localhost", "127.0.0.1"], "distlock").expect("openssl");
        let d = certs.dir();
        let server = EtcdServer::start_with(EtcdServerOptions {
            tls: Some(TlsFiles {
                cert: d.join("server.crt"),
                key: d.join("server.key"),
                ca: d.join("ca.crt"),
            }),
            ..EtcdServerOptions::default()
        })
        .expect("etcd-server with TLS");
        assert!(server.url().starts_with("etcds://"));
        let url = format!(
            "{}?ca_file={}",
            server.url(),
            d.join("ca.crt").to_str().unwrap()
        );
        let p = prefix();
        let reg = LockRegistry::connect(&url, RegistryOptions::default().with_prefix(&p))
            .await
            .expect("TLS connection with the private CA");
        let g = reg.obtain("tls").unwrap().lock().await.unwrap();
        assert_eq!(server_keys(&server, &format!("{p}/tls/")).len(), 1);
        g.release().await.unwrap();

        // Without the CA the server's certificate is not trusted.
        let opts = EtcdOptions {
            connect_timeout: Duration::from_secs(2),
            ..EtcdOptions::default()
        };
        assert!(EtcdBackend::connect_with(&server.url(), opts)
            .await
            .is_err());
        // Plain text to a TLS server fails too.
        let plain = server.url().replace("etcds://", "etcd://");
        let opts = EtcdOptions {
            connect_timeout: Duration::from_secs(2),
            ..EtcdOptions::default()
        };
        assert!(EtcdBackend::connect_with(&plain, opts).await.is_err());
    }
}
