//! etcd backend against real etcd servers (Debian `etcd-server` 3.4, and `etcdctl` from the
//! Debian package `etcd-client`): the `concurrency.Mutex` layout and `etcdctl lock` interop
//! (also with readers, writers and permits),
//! predecessor-only wake-ups and FIFO order, authentication and TLS. Faults are in
//! `etcd_faults.rs`.
//!
//! Tests that do not stop their server share one per test process and keep apart by prefix.

mod common {
    pub mod cost;
    pub mod etcd;
    pub mod fifo;
}

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::etcd::*;
use common::fifo::{queued_attempt, spawn_waiter};
use distlock::backends::etcd::{EtcdBackend, EtcdOptions};
use distlock::{
    AcquireRequest, Attempt, Backend, Error, LockName, LockRegistry, RegistryOptions, Token,
};
use distlock_testkit::etcd::EtcdServer;
use distlock_testkit::tls::TestCa;
use tokio::time::Instant;

/// Named `etcd::…`, so that `-E 'test(/etcd/)'` selects them all.
mod etcd {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn layout_is_the_concurrency_mutex_one() {
        let (server, p) = shared_server();
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
            // The owner token, then the holder's description.
            let (token, owner) = kv.value.split_at(32);
            assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{kv:?}");
            assert!(owner.starts_with(";owner="), "{kv:?}");
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

    /// Holder descriptions are in the keys' values: `etcdctl get` shows ours, and `inspect`
    /// shows an `etcdctl lock` holder (whose value is empty) and a key of an older distlock
    /// (its token alone) as unknown, and another client's value as it is.
    /// `waiter_ttl` in the URL: a waiter's key is attached to a lease of that TTL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_url_sets_the_waiter_ttl() {
        let (server, p) = shared_server();
        let url = format!("{}?waiter_ttl=7s", server.url());
        let a = registry(&url, &p, RegistryOptions::default()).await;
        let b = registry(&url, &p, RegistryOptions::default()).await;
        let g = a.obtain("ttl").unwrap().lock().await.unwrap();
        let waiter = tokio::spawn(async move { b.obtain("ttl").unwrap().lock().await.unwrap() });
        let dir = format!("{p}/ttl/");
        eventually("waiter's key", Duration::from_secs(5), || {
            server_keys(&server, &dir).len() == 2
        })
        .await;
        let younger = server_keys(&server, &dir)[1].lease;
        let ttl = server
            .etcdctl(&["lease", "timetolive", &format!("{younger:x}")])
            .unwrap();
        assert!(ttl.contains("granted with TTL(7s)"), "{ttl}");
        g.release().await.unwrap();
        waiter.await.unwrap().release().await.unwrap();
        let err = EtcdBackend::connect(&format!("{}?waiter_ttl=soon", server.url()))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn owners_of_ours_etcdctl_and_older_keys() {
        let (server, p) = shared_server();
        let opts = RegistryOptions::default().with_owner(distlock::Owner::new("web;1").unwrap());
        let reg = registry(&server.url(), &p, opts).await;
        let owners = |key: &'static str| {
            let reg = reg.clone();
            async move {
                let info = reg.obtain(key).unwrap().inspect().await.unwrap();
                info.map(|i| i.owners).unwrap_or_default()
            }
        };

        let g = reg.obtain("ours").unwrap().lock().await.unwrap();
        let kvs = server_keys(&server, &format!("{p}/ours/"));
        assert_eq!(kvs.len(), 1);
        assert!(kvs[0].value.ends_with(";owner=web%3B1"), "{kvs:?}");
        assert_eq!(owners("ours").await, ["web;1"]);
        g.release().await.unwrap();

        let name = format!("{p}/shared");
        let ctl = CtlLock::spawn(&server.endpoint(), &name, &[]);
        ctl.line(Duration::from_secs(10))
            .expect("etcdctl lock acquired");
        assert_eq!(owners("shared").await, [distlock::UNKNOWN_OWNER]);
        ctl.signal(libc::SIGINT);
        let _ = ctl.wait(Duration::from_secs(5));

        let b = EtcdBackend::connect(&server.url()).await.unwrap();
        let token = format!("{:032x}", 0xabc_u128);
        b.raw_put(&format!("{p}/older/1f"), &token).await.unwrap();
        assert_eq!(owners("older").await, [distlock::UNKNOWN_OWNER]);
        b.raw_put(&format!("{p}/elected/2f"), "leader-7\n")
            .await
            .unwrap();
        assert_eq!(owners("elected").await, ["leader-7"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcdctl_lock_excludes_distlock_and_back() {
        let (server, p) = shared_server();
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

    /// Readers, writers and permits live beside `concurrency.Mutex`'s keys in the lock's
    /// directory, named after their session lease; their values carry the owner token and
    /// description, a permit's its number too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kinds_have_keys_of_their_own_in_the_lock_directory() {
        let (server, p) = shared_server();
        let reg = registry(&server.url(), &p, RegistryOptions::default()).await;
        let r = reg.read_write("doc").unwrap().read().lock().await.unwrap();
        let s = reg.semaphore("pool", 3).unwrap().lock().await.unwrap();
        let keys = server_keys(&server, &format!("{p}/doc/"));
        assert_eq!(keys.len(), 1, "{keys:?}");
        // Named after the session lease the key is attached to, as the mutex's key is; the
        // value is the holder's token and description.
        let owner = distlock::Owner::this_process();
        assert_eq!(keys[0].key, format!("{p}/doc/read-{:x}", keys[0].lease));
        let (read_key, first_token) = (keys[0].key.clone(), r.token());
        assert_eq!(keys[0].value, format!("{};owner={owner}", r.token()));
        assert_eq!(r.fence() >> 10, keys[0].create_revision as u64);
        let keys = server_keys(&server, &format!("{p}/pool/"));
        assert_eq!(keys[0].key, format!("{p}/pool/sem-{:x}", keys[0].lease));
        assert_eq!(
            keys[0].value,
            format!("{};owner={owner};permits=3", s.token())
        );
        r.release().await.unwrap();
        s.release().await.unwrap();
        let w = reg.read_write("doc").unwrap().write().lock().await.unwrap();
        let keys = server_keys(&server, &format!("{p}/doc/"));
        assert_eq!(keys[0].key, format!("{p}/doc/write-{:x}", keys[0].lease));
        w.release().await.unwrap();
        // Two permits of one registry at once: keys of their own, on sessions of their own.
        let sem = reg.semaphore("pool", 3).unwrap();
        let (a, b) = (sem.lock().await.unwrap(), sem.lock().await.unwrap());
        let keys = server_keys(&server, &format!("{p}/pool/"));
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert_ne!(keys[0].key, keys[1].key);
        assert_ne!(keys[0].lease, keys[1].lease);
        a.release().await.unwrap();
        b.release().await.unwrap();
        // The next read reuses the name: etcd keeps every deleted key in its index until a
        // compaction, and a key per hold made read cycles slower and slower.
        let r2 = reg.read_write("doc").unwrap().read().lock().await.unwrap();
        let again = server_keys(&server, &format!("{p}/doc/"));
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!(again[0].key, read_key);
        assert!(
            !again[0].value.starts_with(&first_token.to_string()),
            "a new hold, a new token: {again:?}"
        );
        r2.release().await.unwrap();
    }

    /// `etcdctl lock` on the same name excludes distlock's readers, writers and permits, and is
    /// excluded by them: each side waits for the other and gets in once it lets go; a waiting
    /// `etcdctl lock` keeps new distlock readers out (it counts as a writer).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcdctl_lock_excludes_readers_writers_and_permits_and_back() {
        let (server, p) = shared_server();
        let name = format!("{p}/shared");
        let (a, b) = (
            registry(&server.url(), &p, RegistryOptions::default()).await,
            registry(&server.url(), &p, RegistryOptions::default()).await,
        );
        let busy = |res: distlock::Result<distlock::LockGuard>, what: &str| match res {
            Err(Error::NotAcquired { .. }) => {}
            other => panic!("{what}: expected NotAcquired, got {other:?}"),
        };

        // etcdctl holds: our reader, writer and permit are kept out; a waiting reader gets in
        // once it lets go.
        let ctl = CtlLock::spawn(&server.endpoint(), &name, &[]);
        ctl.line(Duration::from_secs(10))
            .expect("etcdctl lock acquired");
        let rw = a.read_write("shared").unwrap();
        busy(rw.read().try_lock().await, "our reader beside etcdctl");
        busy(rw.write().try_lock().await, "our writer beside etcdctl");
        busy(
            a.semaphore("shared", 2).unwrap().try_lock().await,
            "our permit beside etcdctl",
        );
        let waiting = tokio::spawn({
            let rw = rw.clone();
            async move { rw.read().lock().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "our reader entered beside etcdctl");
        ctl.signal(libc::SIGINT);
        let r = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("our reader gets in after etcdctl")
            .unwrap();
        let _ = ctl.wait(Duration::from_secs(5));

        // Our reader holds: etcdctl waits, and while it waits our new readers are kept out.
        let ctl = CtlLock::spawn(&server.endpoint(), &name, &["echo", "inside"]);
        eventually("etcdctl's key queued", Duration::from_secs(10), || {
            server_keys(&server, &format!("{name}/")).len() == 2
        })
        .await;
        assert_eq!(
            ctl.line(Duration::from_millis(300)),
            None,
            "etcdctl entered"
        );
        busy(
            b.read_write("shared").unwrap().read().try_lock().await,
            "our new reader behind a waiting etcdctl lock",
        );
        r.release().await.unwrap();
        assert_eq!(
            ctl.line(Duration::from_secs(10)).as_deref(),
            Some("inside"),
            "etcdctl gets the lock after our reader"
        );
        assert!(ctl.wait(Duration::from_secs(5)).success());

        // Our permits hold: etcdctl waits until the last one goes.
        let sem = a.semaphore("shared", 2).unwrap();
        let (p1, p2) = (sem.lock().await.unwrap(), sem.lock().await.unwrap());
        let ctl = CtlLock::spawn(&server.endpoint(), &name, &["echo", "inside"]);
        assert_eq!(
            ctl.line(Duration::from_millis(700)),
            None,
            "etcdctl entered"
        );
        p1.release().await.unwrap();
        assert_eq!(
            ctl.line(Duration::from_millis(300)),
            None,
            "etcdctl entered"
        );
        p2.release().await.unwrap();
        assert_eq!(
            ctl.line(Duration::from_secs(10)).as_deref(),
            Some("inside"),
            "etcdctl gets the lock after our permits"
        );
        assert!(ctl.wait(Duration::from_secs(5)).success());
    }

    /// Not a check: prints what an uncontended read-lock cycle (and a permit's) costs beside a
    /// mutex cycle on one server. Run it with
    /// `cargo nextest run -p distlock --all-features --test etcd -E 'test(/cycle_costs/)'
    /// --run-ignored only --no-capture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement; prints figures"]
    async fn cycle_costs_of_the_kinds() {
        let server = EtcdServer::shared().expect("etcd-server");
        let reg = registry(&server.url(), &prefix(), RegistryOptions::default()).await;
        common::cost::print_cycle_costs("etcd", &reg, 300).await;
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
        let Attempt::Acquired { fence: fa } = queued_attempt(&*a, &name, ta, lease).await else {
            panic!("free lock not acquired");
        };
        let mut subs = Vec::new();
        for (be, t) in [(&b, tb), (&c, tc)] {
            assert!(matches!(
                queued_attempt(&**be, &name, t, lease).await,
                Attempt::Busy { .. }
            ));
            subs.push(be.subscribe(&name, t).await.unwrap());
            assert!(matches!(
                queued_attempt(&**be, &name, t, lease).await,
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
        let Attempt::Acquired { fence: fb } = queued_attempt(&*b, &name, tb, lease).await else {
            panic!("woken head did not get the lock");
        };
        assert!(matches!(
            queued_attempt(&*c, &name, tc, lease).await,
            Attempt::Busy { .. }
        ));
        assert!(b.release(&name, tb).await.unwrap().was_held);
        tokio::time::timeout(Duration::from_secs(2), sc.released())
            .await
            .expect("the last waiter is woken");
        let Attempt::Acquired { fence: fc } = queued_attempt(&*c, &name, tc, lease).await else {
            panic!("woken head did not get the lock");
        };
        assert!(fa < fb && fb < fc);
        assert!(c.release(&name, tc).await.unwrap().was_held);
    }

    /// A waiter far back in the queue watches its predecessor from the revision of the read
    /// that found it instead of reading the queue again: it is woken when that predecessor
    /// leaves, and not before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_far_back_is_woken_by_its_predecessor() {
        let server = EtcdServer::shared().expect("etcd-server");
        let name = LockName::new(prefix(), "far").unwrap();
        let lease = Duration::from_secs(10);
        let be = backend(&server.url()).await;
        let tokens: Vec<Token> = (0..40).map(|_| Token::random()).collect();
        let (last, ahead_of_last) = tokens.split_last().unwrap();
        for (i, t) in ahead_of_last.iter().enumerate() {
            let got = queued_attempt(&*be, &name, *t, lease).await;
            assert_eq!(
                matches!(got, Attempt::Acquired { .. }),
                i == 0,
                "{i}: {got:?}"
            );
        }
        // Subscribed before its first attempt, which then arms the watch itself.
        let mut sub = be.subscribe(&name, *last).await.unwrap();
        let Attempt::Busy { ahead, .. } = queued_attempt(&*be, &name, *last, lease).await else {
            panic!("the last waiter got the lock");
        };
        assert!(ahead.is_some_and(|a| a >= 32), "ahead: {ahead:?}");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), sub.released())
                .await
                .is_err(),
            "woken while its predecessor is still queued"
        );
        let pred = ahead_of_last[ahead_of_last.len() - 1];
        be.leave_queue(&name, pred).await.unwrap();
        // Far longer than a watch event takes; only a failing run waits this long.
        tokio::time::timeout(Duration::from_secs(10), sub.released())
            .await
            .expect("woken when its predecessor left");
        assert!(matches!(
            queued_attempt(&*be, &name, *last, lease).await,
            Attempt::Busy { .. }
        ));
        for t in &tokens {
            be.leave_queue(&name, *t).await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_across_processes_are_served_in_arrival_order() {
        let (server, p) = shared_server();
        let holder = registry(&server.url(), &p, RegistryOptions::default()).await;
        let g = holder.obtain("fifo").unwrap().lock().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let reg = registry(&server.url(), &p, RegistryOptions::default()).await;
            tasks.push(spawn_waiter(
                reg,
                "fifo",
                i,
                &order,
                Duration::from_millis(10),
            ));
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
        let (server, p) = shared_server();
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
                .acquire(&AcquireRequest::new(
                    LockName::new(p.as_str(), "auth").unwrap(),
                    Token::random(),
                    Duration::from_secs(5),
                ))
                .await
                .map(|_| ()),
        };
        let err = res.expect_err("anonymous access refused");
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    }

    /// A renewal with a lease that outlives the key's session moves the key to a longer session
    /// (same name, same create revision), alone or in a batch with other holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_longer_lease_moves_the_key_to_a_longer_session() {
        let (server, p) = shared_server();
        let b = backend(&server.url()).await;
        let short = Duration::from_secs(1);
        let long = Duration::from_secs(40);
        let names: Vec<LockName> = ["one", "two", "three"]
            .iter()
            .map(|k| LockName::new(p.as_str(), k).unwrap())
            .collect();
        let tokens: Vec<Token> = names.iter().map(|_| Token::random()).collect();
        for (n, t) in names.iter().zip(&tokens) {
            let got = b.acquire(&AcquireRequest::new(n.clone(), *t, short)).await;
            assert!(matches!(got, Ok(Attempt::Acquired { .. })), "{got:?}");
        }
        let key_of = |k: &str| server_keys(&server, &format!("{p}/{k}/"));
        let before = key_of("one");
        assert!(b.extend(&names[0], tokens[0], long).await.unwrap());
        let batch = [(1, long), (2, short)].map(|(i, lease)| distlock::Renewal {
            name: names[i].clone(),
            token: tokens[i],
            lease,
        });
        let answers: Vec<bool> = b
            .extend_many(&batch)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(answers, [true, true]);
        let remaining = |i: usize| {
            let b = b.clone();
            let name = names[i].clone();
            async move { b.inspect(&name).await.unwrap().unwrap().remaining.unwrap() }
        };
        assert!(remaining(0).await > Duration::from_secs(30));
        assert!(remaining(1).await > Duration::from_secs(30));
        assert!(remaining(2).await <= Duration::from_secs(3));
        let after = key_of("one");
        assert_eq!(
            (&after[0].key, after[0].create_revision),
            (&before[0].key, before[0].create_revision)
        );
        assert_ne!(after[0].lease, before[0].lease);
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
        let port = distlock_testkit::free_port();
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

    #[cfg(feature = "etcd-tls")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_with_a_private_ca() {
        let certs = TestCa::new(&["localhost", "127.0.0.1"], "distlock").expect("test CA");
        let d = certs.dir();
        let server = EtcdServer::start_tls(&certs).expect("etcd-server with TLS");
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
