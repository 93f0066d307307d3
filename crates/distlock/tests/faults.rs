//! Fault tests on a real `redis-server`: the server dies mid-hold, a holder is cut off past its
//! lease, and bad input of every kind. The check is always the same: never two holders at once
//! without the stale one learning it is lost, and fences always tell the stale one.

use std::sync::Arc;
use std::time::Duration;

use distlock::backends::redis::RedisBackend;
use distlock::{Backend, Error, LockRegistry, RegistryOptions};
use distlock_testkit::proxy::FaultProxy;
use distlock_testkit::redis::{RedisServer, RedisServerOptions};

async fn registry(url: &str, opts: RegistryOptions) -> LockRegistry {
    let backend: Arc<dyn Backend> = Arc::new(RedisBackend::connect(url).await.expect("connect"));
    LockRegistry::from_backend(backend, opts).unwrap()
}

fn opts(lease_ms: u64) -> RegistryOptions {
    RegistryOptions::default()
        .with_prefix("faults")
        .with_lease(Duration::from_millis(lease_ms))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_learns_it_is_lost_when_redis_restarts_empty_and_fences_keep_increasing() {
    let mut server = RedisServer::start().expect("redis-server must be installed");
    let url = server.url();
    let reg = registry(&url, opts(600)).await;
    let guard = reg.obtain("job").unwrap().lock().await.unwrap();
    let old_fence = guard.fence();

    server.kill();
    server.restart().expect("restart on the same port");

    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("holder not told that its lock is gone after the restart");
    assert!(!guard.is_held());

    let other = registry(&url, opts(600)).await;
    let next = tokio::time::timeout(Duration::from_secs(5), other.obtain("job").unwrap().lock())
        .await
        .expect("lock free after restart")
        .unwrap();
    assert!(
        next.fence() > old_fence,
        "fence {} not above {old_fence} after data loss",
        next.fence()
    );
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_holder_loses_to_a_new_holder_with_a_larger_fence() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let stalled = registry(&format!("redis://{}", proxy.addr()), opts(400)).await;
    let healthy = registry(&server.url(), opts(400)).await;

    let old = stalled.obtain("row").unwrap().lock().await.unwrap();
    // The network to the holder stalls: its renewals hang, its lease runs out on the server.
    proxy.pause();
    let new = tokio::time::timeout(
        Duration::from_secs(5),
        healthy.obtain("row").unwrap().lock(),
    )
    .await
    .expect("a healthy client gets the lock once the stalled lease ends")
    .unwrap();
    assert!(
        new.fence() > old.fence(),
        "the new holder's fence must tell the stale one"
    );
    // By the time anyone else can hold it, the stalled holder already knows.
    assert!(
        !old.is_held(),
        "two holders at once and the stale one does not know"
    );
    tokio::time::timeout(Duration::from_millis(100), old.lost())
        .await
        .expect("lost signal");
    assert!(matches!(old.ensure_held(), Err(Error::LockLost { .. })));
    proxy.resume();
    new.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_survives_a_short_connection_cut() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let reg = registry(&format!("redis://{}", proxy.addr()), opts(1500)).await;
    let guard = reg.obtain("k").unwrap().lock().await.unwrap();
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.restore();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        guard.is_held(),
        "a brief cut within the lease must not lose the lock"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn malformed_urls_are_config_errors_naming_the_part() {
    for (url, part) in [
        ("redis://", "host"),
        ("redis://127.0.0.1:notaport", "port"),
        ("redis://127.0.0.1:6379/abc", "database"),
        ("nohost", "scheme"),
        ("ftp://x", "scheme"),
    ] {
        let err = distlock::connect(url)
            .await
            .err()
            .unwrap_or_else(|| panic!("{url} accepted"));
        let text = err.to_string().to_lowercase();
        assert!(
            matches!(err, Error::InvalidConfig(_) | Error::Unsupported { .. }),
            "{url}: {err:?}"
        );
        assert!(
            text.contains(part),
            "{url}: message {text:?} does not name the {part}"
        );
    }
}

#[tokio::test]
async fn wrong_password_is_a_permanent_error_and_hides_the_password() {
    let server = RedisServer::start_with(RedisServerOptions {
        password: Some("right-secret".into()),
        ..Default::default()
    })
    .expect("redis-server must be installed");
    // Over plain TCP a password is refused unless the URL opts in: nothing reaches the server.
    let connections = || server.cli(&["INFO", "stats"]).unwrap();
    let received = |info: String| {
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .map(|n| n.trim().parse::<u64>().unwrap())
            .unwrap()
    };
    let before = received(connections());
    let err = RedisBackend::connect(&format!("redis://:right-secret@{}", server.addr()))
        .await
        .expect_err("a password over plain TCP without the opt-in");
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("allow_insecure_auth")),
        "{err:?}"
    );
    assert!(
        !format!("{err} {err:?}").contains("right-secret"),
        "{err:?}"
    );
    // The next INFO's own connection is the only one since.
    assert_eq!(
        received(connections()),
        before + 1,
        "the refused URL connected"
    );
    let url = format!(
        "redis://:wrong-secret@{}?allow_insecure_auth=true",
        server.addr()
    );
    let err = RedisBackend::connect(&url)
        .await
        .expect_err("wrong password accepted");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(
        !format!("{err} {err:?}").contains("wrong-secret"),
        "password leaked: {err}"
    );
    let ok = RedisBackend::connect(&format!(
        "redis://:right-secret@{}?allow_insecure_auth=true",
        server.addr()
    ))
    .await;
    let ok = ok.expect("right password works");
    assert!(
        !format!("{ok:?}").contains("right-secret"),
        "password in Debug output"
    );
}

#[tokio::test]
async fn acl_user_and_password_work() {
    let server = RedisServer::start_with(RedisServerOptions {
        acl_user: Some(("locker".into(), "pw".into())),
        ..Default::default()
    })
    .expect("redis-server must be installed");
    let reg = registry(&server.url(), opts(1000)).await;
    let g = reg.obtain("acl").unwrap().try_lock().await.unwrap();
    g.release().await.unwrap();
}

#[tokio::test]
async fn unreachable_server_is_retryable_and_leaves_nothing_held() {
    let port = distlock_testkit::free_port();
    let err = RedisBackend::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect_err("connected to nothing");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_retryable());

    // A server that goes away while a registry waits: the wait ends with an error in time.
    let mut server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), opts(1000)).await;
    server.kill();
    let started = std::time::Instant::now();
    let res = reg
        .obtain("k")
        .unwrap()
        .try_lock_for(Duration::from_millis(800))
        .await;
    assert!(res.is_err(), "acquired on a dead server");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "waited {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn foreign_set_nx_clients_are_excluded_both_ways() {
    // The common protocol of redis-py's Lock, redsync and Spring: SET key token NX PX.
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), RegistryOptions::default()).await;
    assert_eq!(
        server
            .cli(&["SET", "lock:voucher:42", "foreign", "NX", "PX", "5000"])
            .unwrap(),
        "OK"
    );
    assert!(matches!(
        reg.obtain("voucher:42").unwrap().try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
    assert_eq!(server.cli(&["DEL", "lock:voucher:42"]).unwrap(), "1");
    let g = reg.obtain("voucher:42").unwrap().try_lock().await.unwrap();
    let held_value = server.cli(&["GET", "lock:voucher:42"]).unwrap();
    assert!(
        held_value.contains(&g.token().to_string()),
        "lock value {held_value:?} is not the token"
    );
    assert_eq!(
        server
            .cli(&["SET", "lock:voucher:42", "foreign", "NX", "PX", "5000"])
            .unwrap(),
        "(nil)"
    );
    g.release().await.unwrap();
}
