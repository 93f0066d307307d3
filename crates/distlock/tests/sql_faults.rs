//! Fault tests of the PostgreSQL and MariaDB backends on real servers: connections killed by
//! the server mid-hold, the lock row deleted underneath, PostgreSQL restarted mid-hold (only on
//! a throwaway server this test starts), tables created by many processes at once, wrong
//! passwords and TLS. The check is always the same: never two holders at once without the stale
//! one learning it is lost, and fences always tell the stale one.

use std::sync::Arc;
use std::time::Duration;

use distlock::backends::mysql::MySqlBackend;
use distlock::backends::postgres::PostgresBackend;
use distlock::testkit::mysql::MariaDbServer;
use distlock::testkit::postgres::PostgresServer;
use distlock::{Attempt, Backend, Error, LockName, LockRegistry, RegistryOptions, Token};

fn opts(lease_ms: u64) -> RegistryOptions {
    RegistryOptions::default()
        .prefix("faults")
        .lease(Duration::from_millis(lease_ms))
}

async fn pg(url: &str) -> Arc<dyn Backend> {
    Arc::new(PostgresBackend::connect(url).await.expect("connect"))
}

async fn my(url: &str) -> Arc<dyn Backend> {
    Arc::new(MySqlBackend::connect(url).await.expect("connect"))
}

fn registry(backend: Arc<dyn Backend>, opts: RegistryOptions) -> LockRegistry {
    LockRegistry::from_backend(backend, opts).unwrap()
}

fn pg_kill_connections(db: &distlock::testkit::postgres::TestDatabase) -> usize {
    let rows = db
        .query(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            db.name()
        ))
        .expect("terminate");
    rows.len()
}

fn my_kill_connections(db: &distlock::testkit::mysql::TestDatabase) -> usize {
    let ids = db
        .query(&format!(
            "SELECT id FROM information_schema.processlist \
             WHERE db = '{}' AND id <> CONNECTION_ID()",
            db.name()
        ))
        .expect("processlist");
    let kills: Vec<String> = ids
        .iter()
        .filter_map(|r| r[0].clone())
        .map(|id| format!("KILL {id}"))
        .collect();
    if !kills.is_empty() {
        // A connection may have ended by itself meanwhile: ignore "unknown thread".
        for k in &kills {
            let _ = db.query(k);
        }
    }
    kills.len()
}

/// The holder keeps its lock across the server killing every connection: renewal reconnects.
async fn renewal_survives_killed_connections(
    url: &str,
    backend: fn(&str) -> BoxBackend,
    kill: impl Fn() -> usize,
) {
    let holder = registry(backend(url).await, opts(600));
    let other = registry(backend(url).await, opts(600));
    let guard = holder.obtain("job").unwrap().lock().await.unwrap();
    for _ in 0..3 {
        assert!(kill() > 0, "no connection was killed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            guard.is_held(),
            "lost the lock after its connections were killed"
        );
        assert!(matches!(
            other.obtain("job").unwrap().try_lock().await,
            Err(Error::NotAcquired { .. })
        ));
    }
    guard.extend(Duration::from_millis(600)).await.unwrap();
    guard.release().await.unwrap();
    other
        .obtain("job")
        .unwrap()
        .try_lock()
        .await
        .expect("free after release")
        .release()
        .await
        .unwrap();
}

type BoxBackend = std::pin::Pin<Box<dyn std::future::Future<Output = Arc<dyn Backend>> + Send>>;

fn pg_boxed(url: &str) -> BoxBackend {
    let url = url.to_owned();
    Box::pin(async move { pg(&url).await })
}

fn my_boxed(url: &str) -> BoxBackend {
    let url = url.to_owned();
    Box::pin(async move { my(&url).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_renewal_survives_pg_terminate_backend() {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    let db = server.fresh_database().unwrap();
    renewal_survives_killed_connections(db.url(), pg_boxed, || pg_kill_connections(&db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_renewal_survives_kill() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    renewal_survives_killed_connections(db.url(), my_boxed, || my_kill_connections(&db)).await;
}

/// The listening connection is killed too; once it is back, a release still wakes a waiter
/// that would otherwise not poll for ten seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notifications_resume_after_the_listener_is_killed() {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    let db = server.fresh_database().unwrap();
    let holder = registry(pg(db.url()).await, opts(5000));
    let waiter = registry(
        pg(db.url()).await,
        opts(5000).max_poll_interval(Duration::from_secs(10)),
    );
    let guard = holder.obtain("k").unwrap().lock().await.unwrap();
    let lock = waiter.obtain("k").unwrap();
    let waiting = tokio::spawn(async move { lock.lock().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(pg_kill_connections(&db) >= 2, "holder, waiter and listener");
    // Let the listener reconnect (it wakes the waiter, which finds the lock still held).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished());
    let released = tokio::time::Instant::now();
    guard.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter was not woken after the listener came back")
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by polling, not by NOTIFY: {:?}",
        released.elapsed()
    );
    got.release().await.unwrap();
}

/// A waiter of another backend (another process, as far as the server can tell) is woken by
/// the holder's doorbell, not by polling, also after every connection was killed mid-wait.
async fn mariadb_doorbell_wakes(kill: bool) {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    let holder = registry(my(db.url()).await, opts(5000));
    let waiter = registry(
        my(db.url()).await,
        opts(5000).max_poll_interval(Duration::from_secs(10)),
    );
    for round in 0..3 {
        let guard = holder.obtain("k").unwrap().lock().await.unwrap();
        let lock = waiter.obtain("k").unwrap();
        let waiting = tokio::spawn(async move { lock.lock().await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if kill && round == 1 {
            assert!(
                my_kill_connections(&db) >= 3,
                "pool, doorbell and waiter connections"
            );
            // The doorbell connection is replaced within about a second and takes the
            // doorbell again; the waiter must not take the lock meanwhile.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        assert!(!waiting.is_finished(), "the waiter got a held lock");
        let released = tokio::time::Instant::now();
        guard.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .expect("the waiter was not woken")
            .unwrap()
            .unwrap();
        assert!(
            released.elapsed() < Duration::from_millis(500),
            "round {round}: woken by polling, not by the doorbell: {:?}",
            released.elapsed()
        );
        got.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_doorbell_wakes_waiters_of_other_processes() {
    mariadb_doorbell_wakes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_doorbell_survives_killed_connections() {
    mariadb_doorbell_wakes(true).await;
}

/// Waiters in three processes (three backends) get the lock in the order they came: the
/// turnstile wakes one process per release, the next in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_waiting_processes_are_served_in_arrival_order() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    let holder = registry(my(db.url()).await, opts(5000));
    let guard = holder.obtain("line").unwrap().lock().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        // No polling: only the doorbell and the turnstile can hand the lock on.
        let reg = registry(
            my(db.url()).await,
            opts(5000).max_poll_interval(Duration::from_secs(10)),
        );
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let g = reg.obtain("line").unwrap().lock().await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(100)).await;
            g.release().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    guard.release().await.unwrap();
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("a waiter was never served")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
}

/// Deleting the row underneath the holder: the holder learns it is lost, and the next holder's
/// fence is still larger (it follows the server's clock).
async fn deleted_row(url: &str, backend: fn(&str) -> BoxBackend, delete: impl Fn()) {
    let holder = registry(backend(url).await, opts(600));
    let other = registry(backend(url).await, opts(600));
    let guard = holder.obtain("row").unwrap().lock().await.unwrap();
    let old_fence = guard.fence();
    delete();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the holder was not told its row is gone");
    let next = other.obtain("row").unwrap().try_lock().await.unwrap();
    assert!(
        next.fence() > old_fence,
        "fence {} after the row was deleted is not above {old_fence}",
        next.fence()
    );
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_row_deleted_underneath() {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    let db = server.fresh_database().unwrap();
    deleted_row(db.url(), pg_boxed, || {
        db.query("DELETE FROM distlock_locks").unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_row_deleted_underneath() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    deleted_row(db.url(), my_boxed, || {
        db.query("DELETE FROM distlock_locks").unwrap();
    })
    .await;
}

/// PostgreSQL crashes and comes back mid-hold, on a throwaway server of this test's own: the
/// holder is told as soon as its renewals cannot confirm the lease, and the next holder's
/// fence tells the stale one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_hold_is_reported_to_the_holder() {
    let server = Arc::new(PostgresServer::start().expect("postgresql"));
    let db = server.fresh_database().unwrap();
    let holder = registry(pg(db.url()).await, opts(800));
    let guard = holder.obtain("job").unwrap().lock().await.unwrap();
    let old_fence = guard.fence();

    server.stop();
    let stopped = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the holder was not told that its renewals fail");
    assert!(
        stopped.elapsed() < Duration::from_millis(1000),
        "told only after {:?}",
        stopped.elapsed()
    );
    server.start_again().expect("postgres comes back");

    // Longer leases from here on: this part checks fences and reconnection, not timing.
    let other = registry(pg(db.url()).await, opts(5000));
    let next = tokio::time::timeout(Duration::from_secs(5), other.obtain("job").unwrap().lock())
        .await
        .expect("the lock is free once the old lease has ended")
        .unwrap();
    assert!(next.fence() > old_fence);
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    next.release().await.unwrap();
    // The holder's backend reconnects by itself as well.
    let again = holder
        .obtain("job")
        .unwrap()
        .with_lease(Duration::from_secs(5))
        .unwrap()
        .try_lock_for(Duration::from_secs(5))
        .await
        .unwrap();
    again.release().await.unwrap();
}

/// Many processes (backends) start at once on an empty database: the table is created once,
/// nobody fails, and exactly one of them gets the lock.
async fn concurrent_first_use(backends: Vec<Arc<dyn Backend>>) {
    let name = LockName::new("lock", "first").unwrap();
    let tasks: Vec<_> = backends
        .into_iter()
        .map(|b| {
            let name = name.clone();
            tokio::spawn(async move {
                b.try_acquire(&name, Token::random(), Duration::from_secs(10))
                    .await
            })
        })
        .collect();
    let mut winners = 0;
    for t in tasks {
        if let Attempt::Acquired { .. } = t.await.unwrap().expect("no error on first use") {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_table_created_once_by_concurrent_first_users() {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    let db = server.fresh_database().unwrap();
    let url = format!("{}?table=Shared_Locks&schema=infra", db.url());
    let connecting: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { pg(&url).await })
        })
        .collect();
    let mut backends = Vec::new();
    for c in connecting {
        backends.push(c.await.unwrap());
    }
    concurrent_first_use(backends).await;
    let rows = db.query("SELECT count(*) FROM infra.shared_locks").unwrap();
    assert_eq!(
        rows[0][0].as_deref(),
        Some("1"),
        "table and schema as configured"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_table_created_once_by_concurrent_first_users() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    let other = server.fresh_database().unwrap();
    let url = format!("{}?table=Shared_Locks&schema={}", db.url(), other.name());
    let connecting: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { my(&url).await })
        })
        .collect();
    let mut backends = Vec::new();
    for c in connecting {
        backends.push(c.await.unwrap());
    }
    concurrent_first_use(backends).await;
    let rows = other.query("SELECT COUNT(*) FROM Shared_Locks").unwrap();
    assert_eq!(
        rows[0][0].as_deref(),
        Some("1"),
        "table in the configured schema"
    );
}

#[tokio::test]
async fn unreachable_servers_are_unavailable_without_secrets() {
    for url in [
        "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2s",
        "mysql://u:hunter2@127.0.0.1:1/db?connect_timeout=2s",
    ] {
        let err = distlock::connect(url)
            .await
            .expect_err("nothing listens on port 1");
        assert!(matches!(err, Error::Unavailable { .. }), "{url}: {err:?}");
        assert!(err.is_retryable());
        let text = format!("{err} {err:?}");
        assert!(!text.contains("hunter2"), "{text}");
    }
}

#[tokio::test]
async fn unknown_url_parameters_are_named() {
    for (url, part) in [
        ("postgres://127.0.0.1/db?sslmode=sometimes", "sslmode"),
        ("postgres://127.0.0.1/db?colour=blue", "colour"),
        ("mysql://127.0.0.1/db?ssl-mode=sometimes", "ssl-mode"),
        ("mysql://127.0.0.1/db?colour=blue", "colour"),
        ("mysql://127.0.0.1/db?table=x;y", "table"),
    ] {
        match distlock::connect(url).await {
            Err(Error::InvalidConfig(m)) => assert!(m.contains(part), "{url}: {m}"),
            other => panic!("{url}: {other:?}"),
        }
    }
}

/// Password authentication and TLS on a throwaway PostgreSQL server (the machine's may trust
/// every loopback client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passwords_and_tls() {
    let server = Arc::new(PostgresServer::start().expect("postgresql"));
    let db = server.fresh_database().unwrap();

    let good = PostgresBackend::connect(db.url())
        .await
        .expect("right password");
    let debug = format!("{good:?}");
    let secret = url::Url::parse(db.url())
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    assert!(!debug.contains(&secret), "{debug}");

    let wrong = server.url_with_password(db.name(), "not-the-password");
    let err = PostgresBackend::connect(&wrong)
        .await
        .expect_err("wrong password");
    let text = err.to_string();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert!(text.contains("authentication failed"), "{text}");
    assert!(
        !text.contains("not-the-password") && !text.contains(&secret),
        "{text}"
    );
    assert!(!format!("{err:?}").contains("not-the-password"));

    // TLS: a test CA and a server certificate for "localhost", switched on with a reload.
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let (ca, cert, key) = (p("ca.crt"), p("server.crt"), p("server.key"));
    std::fs::write(
        p("ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl (apt-get install openssl)");
        assert!(status.success(), "openssl {args:?}");
    };
    let subj_ca = "/CN=distlock test CA";
    openssl(&[
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", subj_ca, "-keyout",
        "ca.key", "-out", "ca.crt",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext",
        "-out",
        "server.crt",
    ]);
    let data_dir = db.query("SHOW data_directory").unwrap()[0][0]
        .clone()
        .unwrap();
    for (from, to) in [(&cert, "server.crt"), (&key, "server.key")] {
        let dest = std::path::Path::new(&data_dir).join(to);
        std::fs::copy(from, &dest).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).unwrap();
        let owner = std::fs::metadata(&data_dir).unwrap();
        use std::os::unix::fs::MetadataExt;
        std::os::unix::fs::chown(&dest, Some(owner.uid()), Some(owner.gid())).unwrap();
    }
    db.query("ALTER SYSTEM SET ssl = on").unwrap();
    db.query("SELECT pg_reload_conf()").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let encrypted = |mode: &str| format!("{}?sslmode={mode}&application_name=tls-{mode}", db.url());
    let tls = PostgresBackend::connect(&encrypted("require"))
        .await
        .expect("sslmode=require accepts a self-signed certificate");
    let name = LockName::new("lock", "tls").unwrap();
    let token = Token::random();
    assert!(matches!(
        tls.try_acquire(&name, token, Duration::from_secs(5))
            .await
            .unwrap(),
        Attempt::Acquired { .. }
    ));
    assert!(tls.release(&name, token).await.unwrap().was_held);
    let rows = db
        .query(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE s.ssl AND a.application_name = 'tls-require'",
        )
        .unwrap();
    assert_ne!(
        rows[0][0].as_deref(),
        Some("0"),
        "the connection is encrypted"
    );

    let err = PostgresBackend::connect(&encrypted("verify-full"))
        .await
        .expect_err("a self-signed certificate is not trusted");
    assert!(!err.to_string().contains(&secret));
    let with_ca = format!("{}&sslrootcert={}", encrypted("verify-ca"), ca.display());
    PostgresBackend::connect(&with_ca)
        .await
        .expect("verify-ca with the certificate as CA (its name is not checked)");
    let err = PostgresBackend::connect(&format!(
        "{}&sslrootcert={}",
        encrypted("verify-full"),
        ca.display()
    ))
    .await
    .expect_err("verify-full checks the name: the certificate is for localhost, not 127.0.0.1");
    assert!(!err.to_string().contains(&secret));
    drop(tls);
    drop(good);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_wrong_password_is_a_clear_error() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    let user = format!("dl{:08x}", rand::random::<u32>());
    db.query(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY 'right-pw'; \
         GRANT ALL ON `{}`.* TO '{user}'@'%'",
        db.name()
    ))
    .unwrap();
    let base = url::Url::parse(db.url()).unwrap();
    let with = |pw: &str| {
        let mut u = base.clone();
        u.set_username(&user).unwrap();
        u.set_password(Some(pw)).unwrap();
        u.to_string()
    };
    let good = MySqlBackend::connect(&with("right-pw")).await;
    let bad = MySqlBackend::connect(&with("wrong-pw")).await;
    let _ = db.query(&format!("DROP USER '{user}'@'%'"));
    let good = good.expect("right password");
    assert!(!format!("{good:?}").contains("right-pw"));
    let err = bad.expect_err("wrong password");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("access denied"), "{text}");
    assert!(!text.contains("wrong-pw") && !format!("{err:?}").contains("wrong-pw"));
}
