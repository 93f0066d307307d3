//! Fault tests of the PostgreSQL and MariaDB backends on real servers: connections killed by
//! the server mid-hold, the lock row deleted underneath, PostgreSQL restarted mid-hold (only on
//! a throwaway server this test starts), tables created by many processes at once, wrong
//! passwords and TLS. The check is always the same: never two holders at once without the stale
//! one learning it is lost, and fences always tell the stale one.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeSet;
use std::path::Path;

use distlock::backends::mysql::MySqlBackend;
use distlock::backends::postgres::PostgresBackend;
use distlock::backends::sql::DEFAULT_REQUEST_TIMEOUT;
use distlock::testkit::mysql::MariaDbServer;
use distlock::testkit::postgres::PostgresServer;
use distlock::testkit::proxy::FaultProxy;
use distlock::testkit::tls::TestCa;
use distlock::{
    AcquireMode, Attempt, Backend, Error, LockName, LockRegistry, RegistryOptions, Token,
};

fn opts(lease_ms: u64) -> RegistryOptions {
    RegistryOptions::default()
        .with_prefix("faults")
        .with_lease(Duration::from_millis(lease_ms))
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
        opts(5000).with_max_poll_interval(Duration::from_secs(10)),
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
        opts(5000).with_max_poll_interval(Duration::from_secs(10)),
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
            opts(5000).with_max_poll_interval(Duration::from_secs(10)),
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
                b.acquire(
                    &name,
                    Token::random(),
                    Duration::from_secs(10),
                    AcquireMode::Try,
                )
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
    let ca = TestCa::new(&["localhost"], "certuser").expect("openssl");
    pg_enable_tls(&db, &ca);
    let ca = ca.path("ca.crt");

    let encrypted = |mode: &str| format!("{}?sslmode={mode}&application_name=tls-{mode}", db.url());
    let tls = PostgresBackend::connect(&encrypted("require"))
        .await
        .expect("sslmode=require accepts a self-signed certificate");
    let name = LockName::new("lock", "tls").unwrap();
    let token = Token::random();
    assert!(matches!(
        tls.acquire(&name, token, Duration::from_secs(5), AcquireMode::Try)
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
        // The machine's server offers no TLS: sending a password there needs the opt-in.
        u.query_pairs_mut()
            .append_pair("allow_insecure_auth", "true");
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

/// Switches TLS on in a throwaway PostgreSQL server with the CA's server certificate (and the
/// CA for client certificates), with a reload.
fn pg_enable_tls(db: &distlock::testkit::postgres::TestDatabase, ca: &TestCa) {
    let data_dir = db.query("SHOW data_directory").unwrap()[0][0]
        .clone()
        .unwrap();
    for (from, to) in [
        ("server.crt", "server.crt"),
        ("server.key", "server.key"),
        ("ca.crt", "root.crt"),
    ] {
        let dest = Path::new(&data_dir).join(to);
        std::fs::copy(ca.path(from), &dest).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).unwrap();
        let owner = std::fs::metadata(&data_dir).unwrap();
        use std::os::unix::fs::MetadataExt;
        std::os::unix::fs::chown(&dest, Some(owner.uid()), Some(owner.gid())).unwrap();
    }
    db.query("ALTER SYSTEM SET ssl = on").unwrap();
    db.query("ALTER SYSTEM SET ssl_ca_file = 'root.crt'")
        .unwrap();
    db.query("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(300));
}

/// `url` with its host and port replaced (its user, password and parameters kept).
fn with_host(url: &str, host: &str, port: u16) -> url::Url {
    let mut u = url::Url::parse(url).unwrap();
    u.set_host(Some(host)).unwrap();
    u.set_port(Some(port)).unwrap();
    u
}

fn server_addr(url: &str) -> std::net::SocketAddr {
    let u = url::Url::parse(url).unwrap();
    let port = u
        .port()
        .unwrap_or(if u.scheme() == "mysql" { 3306 } else { 5432 });
    format!("{}:{port}", u.host_str().unwrap()).parse().unwrap()
}

fn pg_sessions(db: &distlock::testkit::postgres::TestDatabase) -> BTreeSet<String> {
    db.query(&format!(
        "SELECT pid::text FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid()",
        db.name()
    ))
    .unwrap()
    .into_iter()
    .filter_map(|r| r[0].clone())
    .collect()
}

fn my_sessions(db: &distlock::testkit::mysql::TestDatabase) -> BTreeSet<String> {
    db.query(&format!(
        "SELECT id FROM information_schema.processlist WHERE db = '{}' AND id <> CONNECTION_ID()",
        db.name()
    ))
    .unwrap()
    .into_iter()
    .filter_map(|r| r[0].clone())
    .collect()
}

/// With the network to the server stalled (packets held, nothing closed), `try_lock_for(1 s)`
/// returns within its wait plus the request timeout instead of blocking for minutes; the
/// stalled connection is closed, not reused, and once the network is back the next call works
/// on a fresh connection.
async fn stalled_server_bounds_try_lock_for(
    url: &str,
    backend: fn(&str) -> BoxBackend,
    sessions: impl Fn() -> BTreeSet<String>,
) {
    let proxy = FaultProxy::start(server_addr(url)).await.unwrap();
    let via = with_host(url, "127.0.0.1", proxy.addr().port()).to_string();
    let reg = registry(backend(&via).await, opts(30_000));
    // The round trip through the proxy, for the bound.
    let mut round_trip = Duration::ZERO;
    for _ in 0..3 {
        let t = tokio::time::Instant::now();
        let g = reg.obtain("warm").unwrap().try_lock().await.unwrap();
        g.release().await.unwrap();
        round_trip = round_trip.max(t.elapsed() / 2);
    }
    let before = sessions();
    assert!(!before.is_empty());

    proxy.pause();
    let wait = Duration::from_secs(1);
    let bound = wait + DEFAULT_REQUEST_TIMEOUT + Duration::from_secs(1) + round_trip * 20;
    let started = tokio::time::Instant::now();
    let lock = reg.obtain("k").unwrap();
    let outcome =
        tokio::time::timeout(bound + Duration::from_secs(20), lock.try_lock_for(wait)).await;
    let took = started.elapsed();
    let result = outcome.unwrap_or_else(|_| {
        panic!("try_lock_for({wait:?}) still blocked after {took:?} with the server stalled")
    });
    assert!(
        took <= bound,
        "try_lock_for({wait:?}) took {took:?} with the server stalled (bound {bound:?})"
    );
    assert!(
        matches!(&result, Err(e) if e.is_retryable()),
        "{:?}",
        result.map(|g| g.fence())
    );

    // The caller stopped waiting at its deadline, but its attempt runs on in the background
    // until the request timeout: the stall outlasts that, so the stalled connection is the one
    // that must be given up (a stall that ended earlier would simply let it answer).
    tokio::time::sleep_until(started + DEFAULT_REQUEST_TIMEOUT + Duration::from_secs(1)).await;
    proxy.resume();
    let g = tokio::time::timeout(
        Duration::from_secs(10),
        lock.try_lock_for(Duration::from_secs(5)),
    )
    .await
    .expect("the next call hangs after the stall ended")
    .expect("the next call works after the stall ended");
    g.release().await.unwrap();
    stalled_session_is_gone(&before, sessions).await;
}

/// Waits until one of the sessions seen `before` a stall has ended on the server: the client
/// closed the stalled connection (the proxy passes the close on once it forwards again)
/// instead of using it again.
async fn stalled_session_is_gone(
    before: &BTreeSet<String>,
    sessions: impl Fn() -> BTreeSet<String>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let after = sessions();
        if before.iter().any(|s| !after.contains(s)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled connection was kept: sessions before {before:?}, after {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_try_lock_for_is_bounded_when_the_server_stalls() {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    let db = server.fresh_database().unwrap();
    stalled_server_bounds_try_lock_for(db.url(), pg_boxed, || pg_sessions(&db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_try_lock_for_is_bounded_when_the_server_stalls() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    stalled_server_bounds_try_lock_for(db.url(), my_boxed, || my_sessions(&db)).await;
}

/// A holder whose renewals meet a stalled server is told it lost the lock no later than its
/// own reckoning of the lease ends; the connection of the stalled renewal is closed, not
/// reused, and the backend works again once the network is back.
async fn stalled_renewal_is_lost_by_the_lease_end(
    url: &str,
    backend: fn(&str) -> BoxBackend,
    sessions: impl Fn() -> BTreeSet<String>,
) {
    let proxy = FaultProxy::start(server_addr(url)).await.unwrap();
    let via = with_host(url, "127.0.0.1", proxy.addr().port()).to_string();
    let lease = Duration::from_millis(1500);
    let reg = registry(backend(&via).await, opts(1500));
    let lock = reg.obtain("held").unwrap();
    let asked = tokio::time::Instant::now();
    let guard = lock.lock().await.unwrap();
    let before = sessions();
    proxy.pause();
    // The client counts the lease from before its request: it ends by `asked + lease`. A few
    // milliseconds allow for the timer that reports it.
    tokio::time::timeout_at(asked + lease + Duration::from_millis(50), guard.lost())
        .await
        .expect("the holder was not told by the end of its lease");
    assert!(!guard.is_held());
    drop(guard);
    // Stay stalled until the renewal's own limit (its lease, counted from when it was sent
    // at about a third of the first lease) has passed for sure.
    tokio::time::sleep_until(asked + lease * 2).await;
    proxy.resume();
    let next = tokio::time::timeout(
        Duration::from_secs(10),
        lock.try_lock_for(Duration::from_secs(5)),
    )
    .await
    .expect("the backend hangs after the stall")
    .expect("the backend works after the stall");
    next.release().await.unwrap();
    stalled_session_is_gone(&before, sessions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stalled_renewal_is_lost_by_the_lease_end() {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    let db = server.fresh_database().unwrap();
    stalled_renewal_is_lost_by_the_lease_end(db.url(), pg_boxed, || pg_sessions(&db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_stalled_renewal_is_lost_by_the_lease_end() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    stalled_renewal_is_lost_by_the_lease_end(db.url(), my_boxed, || my_sessions(&db)).await;
}

/// A server that asks for the password in cleartext gets it only over TLS whose certificate
/// was verified, or with the URL's explicit `allow_insecure_auth=true`; the refusal is a
/// permanent error that names the way out and never the password. Client certificates work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cleartext_passwords_go_only_to_verified_servers() {
    let server = Arc::new(PostgresServer::start().expect("postgresql"));
    let db = server.fresh_database().unwrap();
    let secret = url::Url::parse(db.url())
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    let data_dir = db.query("SHOW data_directory").unwrap()[0][0]
        .clone()
        .unwrap();
    let hba = Path::new(&data_dir).join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!(
            "hostssl all certuser 127.0.0.1/32 cert\n\
             host all all 127.0.0.1/32 password\n\
             host all all ::1/128 password\n{old}"
        ),
    )
    .unwrap();
    db.query("CREATE ROLE certuser LOGIN SUPERUSER").unwrap();
    db.query("SELECT pg_reload_conf()").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let secret = &secret;
    let refused = |url: String| async move {
        let err = PostgresBackend::connect(&url)
            .await
            .expect_err("the password must not be sent");
        let text = format!("{err} {err:?}");
        assert!(matches!(err, Error::Backend { .. }), "{url}: {err:?}");
        assert!(text.contains("refused to send the password"), "{text}");
        assert!(text.contains("allow_insecure_auth"), "{text}");
        assert!(!text.contains(secret.as_str()), "{text}");
    };
    let port = url::Url::parse(db.url()).unwrap().port().unwrap();
    let at = |host: &str, query: &str| {
        let mut u = with_host(db.url(), host, port);
        u.set_query(Some(query));
        u.to_string()
    };
    // No TLS on the server yet: plain TCP, whatever the mode.
    refused(at("127.0.0.1", "sslmode=disable")).await;
    refused(db.url().to_owned()).await;
    PostgresBackend::connect(&at("127.0.0.1", "sslmode=disable&allow_insecure_auth=true"))
        .await
        .expect("the explicit opt-in sends it");

    let ca = TestCa::new(&["localhost"], "certuser").expect("openssl");
    pg_enable_tls(&db, &ca);
    let root = ca.path("ca.crt").display().to_string();
    // Encrypted, but the certificate is not verified: still refused.
    refused(at("127.0.0.1", "sslmode=require")).await;
    refused(at("localhost", "sslmode=prefer")).await;
    // Verified (the certificate names localhost): sent.
    for mode in ["prefer", "require", "verify-full"] {
        let b = PostgresBackend::connect(&at(
            "localhost",
            &format!("sslmode={mode}&sslrootcert={root}"),
        ))
        .await
        .unwrap_or_else(|e| panic!("sslmode={mode} with the CA: {e}"));
        let name = LockName::new("lock", "verified").unwrap();
        let token = Token::random();
        assert!(matches!(
            b.acquire(&name, token, Duration::from_secs(5), AcquireMode::Try)
                .await
                .unwrap(),
            Attempt::Acquired { .. }
        ));
        assert!(b.release(&name, token).await.unwrap().was_held);
    }

    // A client certificate instead of a password.
    let cert_url = |with_cert: bool| {
        let mut u = with_host(db.url(), "localhost", port);
        u.set_username("certuser").unwrap();
        u.set_password(None).unwrap();
        let mut q = format!("sslmode=verify-full&sslrootcert={root}");
        if with_cert {
            q.push_str(&format!(
                "&sslcert={}&sslkey={}",
                ca.path("client.crt").display(),
                ca.path("client.key").display()
            ));
        }
        u.set_query(Some(&q));
        u.to_string()
    };
    PostgresBackend::connect(&cert_url(true))
        .await
        .expect("the client certificate is accepted");
    PostgresBackend::connect(&cert_url(false))
        .await
        .expect_err("no client certificate, no access");
}

/// MariaDB: a password is not sent to a server that offers no TLS, unless the URL opts in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_passwords_are_not_sent_to_unverified_servers() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    let user = format!("dl{:08x}", rand::random::<u32>());
    db.query(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY 'plain-secret'; \
         GRANT ALL ON `{}`.* TO '{user}'@'%'",
        db.name()
    ))
    .unwrap();
    let with = |query: &str| {
        let mut u = url::Url::parse(db.url()).unwrap();
        u.set_username(&user).unwrap();
        u.set_password(Some("plain-secret")).unwrap();
        u.set_query(Some(query));
        u.to_string()
    };
    let mut errors = Vec::new();
    for query in [
        "",
        "ssl-mode=preferred",
        "ssl-mode=disabled",
        "ssl-mode=required",
    ] {
        errors.push(MySqlBackend::connect(&with(query)).await.err());
    }
    let opted_in = MySqlBackend::connect(&with("allow_insecure_auth=true")).await;
    let _ = db.query(&format!("DROP USER '{user}'@'%'"));
    for err in errors {
        let err = err.expect("the password must not be sent");
        let text = format!("{err} {err:?}");
        assert!(!err.is_retryable(), "{text}");
        assert!(text.contains("refusing to send the password"), "{text}");
        assert!(text.contains("allow_insecure_auth"), "{text}");
        assert!(!text.contains("plain-secret"), "{text}");
    }
    opted_in.expect("the explicit opt-in sends it");
}

/// MariaDB over TLS with a private CA: verified modes work, a certificate that cannot be
/// verified gets no password, `required` (not verified) needs the opt-in, and a user that
/// must show a client certificate can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_tls_with_a_private_ca_and_client_certificates() {
    let ca = TestCa::new(&["localhost"], "certuser").expect("openssl");
    let arg = |name: &str, file: &str| format!("--{name}={}", ca.path(file).display());
    let (c, k, a) = (
        arg("ssl-cert", "server.crt"),
        arg("ssl-key", "server.key"),
        arg("ssl-ca", "ca.crt"),
    );
    let server = Arc::new(MariaDbServer::start_with_args(&[&c, &k, &a]).expect("mariadb-server"));
    let db = server.fresh_database().unwrap();
    db.query(&format!(
        "CREATE USER 'pwuser'@'%' IDENTIFIED BY 'tls-secret' REQUIRE SSL; \
         GRANT ALL ON `{0}`.* TO 'pwuser'@'%'; \
         CREATE USER 'certuser'@'%' REQUIRE X509; \
         GRANT ALL ON `{0}`.* TO 'certuser'@'%'",
        db.name()
    ))
    .unwrap();
    let root = ca.path("ca.crt").display().to_string();
    let port = url::Url::parse(db.url()).unwrap().port().unwrap();
    let at = |host: &str, user: &str, password: Option<&str>, query: &str| {
        let mut u = with_host(db.url(), host, port);
        u.set_username(user).unwrap();
        u.set_password(password).unwrap();
        u.set_query(Some(query));
        u.to_string()
    };
    // The certificate names localhost. (mysql_async's rustls verifier checks the name even
    // with verify_ca, so that mode needs the name as well.)
    let with =
        |user: &str, password: Option<&str>, query: &str| at("localhost", user, password, query);
    let pw = |query: &str| with("pwuser", Some("tls-secret"), query);
    let works = |url: String| async move {
        let b = MySqlBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let name = LockName::new("lock", "tls").unwrap();
        let token = Token::random();
        assert!(matches!(
            b.acquire(&name, token, Duration::from_secs(5), AcquireMode::Try)
                .await
                .unwrap(),
            Attempt::Acquired { .. }
        ));
        assert!(b.release(&name, token).await.unwrap().was_held);
    };
    // The user requires TLS, so every success below went over TLS.
    works(pw(&format!("ssl-mode=verify_ca&ssl-ca={root}"))).await;
    works(pw(&format!("ssl-mode=verify_identity&ssl-ca={root}"))).await;
    works(pw(&format!("ssl-mode=preferred&ssl-ca={root}"))).await;
    works(pw("ssl-mode=required&allow_insecure_auth=true")).await;
    // The certificate names localhost, not 127.0.0.1; nor is it signed by a public CA.
    for (host, query) in [
        (
            "127.0.0.1",
            format!("ssl-mode=verify_identity&ssl-ca={root}"),
        ),
        ("localhost", "ssl-mode=preferred".to_owned()),
        ("localhost", "ssl-mode=verify_ca".to_owned()),
    ] {
        let err = MySqlBackend::connect(&at(host, "pwuser", Some("tls-secret"), &query))
            .await
            .expect_err("a certificate that cannot be verified gets no password");
        let text = format!("{err} {err:?}");
        assert!(matches!(err, Error::Backend { .. }), "{query}: {text}");
        assert!(text.contains("TLS"), "{query}: {text}");
        assert!(!text.contains("tls-secret"), "{text}");
    }
    match MySqlBackend::connect(&pw("ssl-mode=required")).await {
        Err(Error::InvalidConfig(m)) => {
            assert!(
                m.contains("allow_insecure_auth") && !m.contains("tls-secret"),
                "{m}"
            )
        }
        other => panic!(
            "ssl-mode=required sent the password: {:?}",
            other.map(|_| ())
        ),
    }
    // A client certificate instead of a password.
    let client = format!(
        "ssl-mode=verify_ca&ssl-ca={root}&ssl-cert={}&ssl-key={}",
        ca.path("client.crt").display(),
        ca.path("client.key").display()
    );
    works(with("certuser", None, &client)).await;
    MySqlBackend::connect(&with(
        "certuser",
        None,
        &format!("ssl-mode=verify_ca&ssl-ca={root}"),
    ))
    .await
    .expect_err("no client certificate, no access");
}
