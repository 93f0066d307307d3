//! `rediss://`: a real TLS redis-server with a private CA made for the test by `openssl`.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock::backends::redis::{RedisBackend, RedisOptions};
use distlock::testkit::tls::TestCa;
use distlock::{Error, LockRegistry, RegistryOptions};

struct TlsRedis {
    child: Child,
    port: u16,
    ca: Vec<u8>,
    _certs: TestCa,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_tls_redis() -> TlsRedis {
    let certs = TestCa::new(&["localhost", "127.0.0.1"], "distlock").expect("openssl");
    let d = certs.dir();
    let port = distlock::testkit::free_port();
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
        _certs: certs,
    }
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
    let reg = LockRegistry::from_backend(std::sync::Arc::new(backend), RegistryOptions::default())
        .unwrap();
    let other = LockRegistry::from_backend(
        std::sync::Arc::new(RedisBackend::connect_with(&url, options).await.unwrap()),
        RegistryOptions::default(),
    )
    .unwrap();
    let g = reg.obtain("tls").unwrap().lock().await.unwrap();
    assert!(matches!(
        other.obtain("tls").unwrap().try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
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
