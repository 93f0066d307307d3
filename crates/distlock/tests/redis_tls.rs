//! `rediss://`: a real TLS redis-server with a private CA made for the test by `openssl`.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock::backends::redis::{RedisBackend, RedisOptions};
use distlock::{Error, LockRegistry, RegistryOptions};

struct TlsRedis {
    child: Child,
    port: u16,
    ca: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl must be installed (scripts/test.sh installs it)");
    assert!(status.success(), "openssl {args:?} failed");
}

fn start_tls_redis() -> TlsRedis {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=distlock-test-ca",
        ],
    );
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        d.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
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
    let ca = std::fs::read(d.join("ca.crt")).unwrap();
    TlsRedis {
        child,
        port,
        ca,
        _dir: dir,
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
