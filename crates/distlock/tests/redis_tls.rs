//! `rediss://` and `redlocks://`: real TLS redis-servers with a private CA made for the test by
//! the testkit's `TestCa`.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock::backends::redis::{RedisBackend, RedisOptions};
use distlock::{Error, LockRegistry, RegistryOptions};
use distlock_testkit::tls::TestCa;

struct TlsRedis {
    child: Child,
    port: u16,
    ca: Vec<u8>,
    _certs: Option<TestCa>,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_tls_redis() -> TlsRedis {
    let certs = TestCa::new(&["localhost", "127.0.0.1"], "distlock").expect("test CA");
    let mut server = start_tls_redis_with(&certs);
    server._certs = Some(certs);
    server
}

/// A TLS server with the certificate of `certs`, whose directory must outlive it.
fn start_tls_redis_with(certs: &TestCa) -> TlsRedis {
    let d = certs.dir();
    let port = distlock_testkit::free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            "server.crt",
            "--tls-key-file",
            "server.key",
        ])
        .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
        .args(["--save", "", "--appendonly", "no", "--dir", "."])
        .current_dir(d)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed");
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "TLS redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ca = std::fs::read(certs.ca_cert()).unwrap();
    TlsRedis {
        child,
        port,
        ca,
        _certs: None,
    }
}

fn registry(backend: std::sync::Arc<dyn distlock::Backend>) -> LockRegistry {
    LockRegistry::from_backend(backend, RegistryOptions::default()).unwrap()
}

/// `reg` takes `tls`, and `other`'s try is refused meanwhile.
async fn held_and_refused(reg: &LockRegistry, other: &LockRegistry) -> distlock::LockGuard {
    let g = reg.obtain("tls").unwrap().lock().await.unwrap();
    assert!(matches!(
        other.obtain("tls").unwrap().try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
    g
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_tls_with_a_private_ca() {
    let server = start_tls_redis();
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let options = RedisOptions {
        tls_root_cert_pem: Some(server.ca.clone()),
        ..Default::default()
    };
    let backend = RedisBackend::connect_with(&url, options.clone())
        .await
        .expect("TLS connect");
    let reg = registry(std::sync::Arc::new(backend));
    let other = registry(std::sync::Arc::new(
        RedisBackend::connect_with(&url, options).await.unwrap(),
    ));
    let g = held_and_refused(&reg, &other).await;
    let waiter =
        tokio::spawn(async move { other.obtain("tls").unwrap().lock().await.map(|g| g.fence()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fence = g.fence();
    g.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next > fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let server = start_tls_redis();
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let err = RedisBackend::connect(&url)
        .await
        .expect_err("untrusted certificate accepted");
    assert!(!matches!(err, Error::InvalidConfig(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_works_over_tls_nodes() {
    let certs = TestCa::new(&["localhost", "127.0.0.1"], "distlock").expect("test CA");
    let nodes: Vec<TlsRedis> = (0..3).map(|_| start_tls_redis_with(&certs)).collect();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let hosts = hosts.join(",");
    let ca = certs.ca_cert();
    let url = format!("redlocks://{hosts}?ca_file={}", ca.display());
    let reg = registry(distlock::connect(&url).await.expect("TLS connect"));
    let other = registry(distlock::connect(&url).await.unwrap());
    let g = held_and_refused(&reg, &other).await;
    g.release().await.unwrap();
    distlock_testkit::holds::free(&other, "tls", "free").await;

    // Without the private CA the nodes' certificates are not trusted.
    let err = distlock::connect(&format!("redlocks://{hosts}"))
        .await
        .expect_err("untrusted certificates accepted");
    assert!(!matches!(err, Error::InvalidConfig(_)), "{err:?}");
    // Plain connections to TLS ports get no answer a Redis client accepts.
    assert!(distlock::connect(&format!("redlock://{hosts}"))
        .await
        .is_err());
    for (url, part) in [
        (
            format!("redlock://{hosts}?ca_file={}", ca.display()),
            "redlocks://",
        ),
        (
            format!("redlocks://{hosts}?ca_file=/no/such/ca.pem"),
            "cannot be read",
        ),
        (format!("redlocks://{hosts}?bogus=1"), "bogus"),
    ] {
        match distlock::connect(&url).await {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(part), "{url}: {msg}"),
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }
}
