//! `zks://` on real ZooKeeper servers serving TLS (the testkit's Netty `secureClientPort`, with a
//! throwaway CA): locks over TLS, a server whose certificate the CA did not sign refused with a
//! clear error, a server that requires client certificates, and digest credentials allowed
//! without `allow_insecure_auth` once the server is verified.

mod common {
    pub mod zookeeper;
}

use std::time::{Duration, Instant};

use common::zookeeper::{acl, root};
use distlock::backends::zookeeper::{ZooKeeperBackend, ZooKeeperOptions};
use distlock::{Error, LockRegistry, RegistryOptions};
use distlock_testkit::tls::TestCa;
use distlock_testkit::zookeeper::{ZooKeeperServer, ZooKeeperTls};

fn test_ca() -> TestCa {
    TestCa::new(&["localhost", "127.0.0.1"], "distlock").expect("test CA")
}

fn tls_server(ca: &TestCa, need_client_auth: bool) -> ZooKeeperServer {
    ZooKeeperServer::start_tls(ZooKeeperTls::from_test_ca(ca, need_client_auth))
        .expect("ZooKeeper with TLS (apt-get install zookeeper)")
}

/// `zks://[cred]127.0.0.1:<secure port><root>?ca_file=<ca>[&cert_file=..&key_file=..]`.
fn url(server: &ZooKeeperServer, cred: &str, root: &str, ca: &TestCa, client_cert: bool) -> String {
    let mut u = format!(
        "zks://{cred}127.0.0.1:{}{root}?ca_file={}",
        server.secure_port().expect("TLS port"),
        ca.ca_cert().display()
    );
    if client_cert {
        let (cert, key) = ca.client_cert_and_key();
        u.push_str(&format!(
            "&cert_file={}&key_file={}",
            cert.display(),
            key.display()
        ));
    }
    u
}

fn quick() -> ZooKeeperOptions {
    ZooKeeperOptions {
        connect_timeout: Duration::from_secs(5),
        ..ZooKeeperOptions::default()
    }
}

async fn lock_and_release(url: &str) {
    let reg = LockRegistry::connect(url, RegistryOptions::default())
        .await
        .expect("connect over TLS");
    let g = reg.obtain("tls").unwrap().lock().await.unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_verified_against_the_ca() {
    let ca = test_ca();
    let server = tls_server(&ca, false);
    assert!(server.tls_url(&ca.ca_cert()).unwrap().starts_with("zks://"));
    let r = root();
    let u = url(&server, "", &r, &ca, false);
    let b = ZooKeeperBackend::connect(&u).await.expect("zks://");
    let reg = LockRegistry::from_backend(
        std::sync::Arc::new(b) as std::sync::Arc<dyn distlock::Backend>,
        RegistryOptions::default(),
    )
    .unwrap();
    let g = reg.obtain("k").unwrap().lock().await.unwrap();
    // A second contender over TLS waits, and gets it after the release.
    let reg2 = LockRegistry::connect(&u, RegistryOptions::default())
        .await
        .unwrap();
    assert!(reg2.obtain("k").unwrap().try_lock().await.is_err());
    let fence = g.fence();
    g.release().await.unwrap();
    let g2 = reg2.obtain("k").unwrap().lock().await.unwrap();
    assert!(g2.fence() > fence);
    g2.release().await.unwrap();
    // The server's certificate names 127.0.0.1 and localhost: both verify.
    lock_and_release(&u.replace("127.0.0.1", "localhost")).await;
    // The testkit's own URL works as it is.
    lock_and_release(&server.tls_url(&ca.ca_cert()).unwrap()).await;
}

/// A server whose certificate another CA signed is refused at once, with a typed error that
/// says why (not a connect timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_signed_by_another_ca_is_refused_clearly() {
    let ca = test_ca();
    let other = test_ca();
    let server = tls_server(&ca, false);
    let u = url(&server, "alice:hunter2@", &root(), &other, false);
    let start = Instant::now();
    let err = ZooKeeperBackend::connect_with(&u, quick())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Backend { message, .. }
            if message.contains("TLS") && message.contains("certificate")
                && message.contains("ca_file")),
        "{err:?}"
    );
    assert!(!err.is_retryable(), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    // By host name too (`localhost` may resolve to ::1 first; the server listens on 127.0.0.1).
    let err = ZooKeeperBackend::connect_with(&u.replace("127.0.0.1", "localhost"), quick())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Backend { message, .. } if message.contains("certificate")),
        "{err:?}"
    );
    // Plain text to the TLS port gets no session either.
    let plain = format!("zk://127.0.0.1:{}", server.secure_port().unwrap());
    assert!(ZooKeeperBackend::connect_with(
        &plain,
        ZooKeeperOptions {
            connect_timeout: Duration::from_secs(2),
            ..ZooKeeperOptions::default()
        }
    )
    .await
    .is_err());
}

/// URLs that cannot work are configuration errors before any connection: no `ca_file`, an
/// unreadable one, a host name no certificate can name, a lone `cert_file`.
#[tokio::test]
async fn bad_tls_urls_are_configuration_errors() {
    let ca = test_ca();
    let ca_file = ca.ca_cert();
    let ca_file = ca_file.display();
    for (url, part) in [
        ("zks://127.0.0.1:1".to_owned(), "ca_file"),
        (
            "zks://127.0.0.1:1?ca_file=/nonexistent.pem".to_owned(),
            "cannot read",
        ),
        (format!("zks://bad_host!:1?ca_file={ca_file}"), "host"),
        (
            format!("zks://127.0.0.1:1?ca_file={ca_file}&cert_file=c.pem"),
            "go together",
        ),
        (format!("zk://127.0.0.1:1?ca_file={ca_file}"), "zks://"),
    ] {
        let err = ZooKeeperBackend::connect(&url).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig(m) if m.contains(part)),
            "{url}: {err:?}"
        );
    }
}

/// `ssl.clientAuth=need`: with `cert_file`/`key_file` the lock works; without, the refusal says
/// a client certificate is wanted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_client_certificates() {
    let ca = test_ca();
    let server = tls_server(&ca, true);
    let r = root();
    lock_and_release(&url(&server, "", &r, &ca, true)).await;

    let err = ZooKeeperBackend::connect_with(&url(&server, "", &r, &ca, false), quick())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Backend { message, .. }
            if message.contains("TLS") && message.contains("client certificate")),
        "{err:?}"
    );
}

/// Over verified TLS digest credentials need no `allow_insecure_auth`; they protect the nodes
/// as over plain TCP. Over plain TCP the same credentials still need the explicit opt-in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_over_verified_tls() {
    let ca = test_ca();
    let server = tls_server(&ca, false);
    let r = root();
    let alice = ZooKeeperBackend::connect(&url(&server, "alice:s3cr%40t@", &r, &ca, false))
        .await
        .expect("credentials over zks:// without allow_insecure_auth");
    assert!(!format!("{alice:?}").contains("s3cr"), "{alice:?}");
    let alice = std::sync::Arc::new(alice);
    let reg = LockRegistry::from_backend(
        alice.clone() as std::sync::Arc<dyn distlock::Backend>,
        RegistryOptions::default(),
    )
    .unwrap();
    let g = reg.obtain("k").unwrap().lock().await.unwrap();
    let acl = acl(&alice, &format!("{r}/k")).await;
    assert_eq!(acl[0].scheme(), "digest");
    assert!(acl[0].id().starts_with("alice:"), "{:?}", acl[0]);
    // Without the credentials (still over TLS) the lock cannot be taken.
    let anonymous = LockRegistry::connect(
        &url(&server, "", &r, &ca, false),
        RegistryOptions::default(),
    )
    .await
    .unwrap();
    assert!(matches!(
        anonymous.obtain("k").unwrap().try_lock().await,
        Err(Error::Backend { .. })
    ));
    g.release().await.unwrap();

    let plain = format!("zk://alice:s3cr%40t@127.0.0.1:{}{r}", server.port());
    let err = ZooKeeperBackend::connect(&plain).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("allow_insecure_auth") && m.contains("zks://")),
        "{err:?}"
    );
    assert!(!format!("{err} {err:?}").contains("s3cr"), "{err:?}");
}

/// `zookeeper-tls` builds rustls with two providers (ring and aws-lc-rs), and then
/// `ClientConfig::builder()`, which `zookeeper-client`, `redis` and `mysql_async` call, panics
/// without a process default. After a `zks://` connection ring is that default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_becomes_the_process_default_provider() {
    let ca = test_ca();
    let server = tls_server(&ca, false);
    lock_and_release(&url(&server, "", &root(), &ca, false)).await;
    let default = rustls::crypto::CryptoProvider::get_default().expect("a default provider");
    // Deprecated since rustls 0.23.48 (no post-quantum key exchange), still what distlock uses.
    #[allow(deprecated)]
    let ring = rustls::crypto::ring::default_provider();
    let suites = |p: &rustls::crypto::CryptoProvider| {
        p.cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect::<Vec<_>>()
    };
    assert_eq!(suites(default), suites(&ring));
    let _ = rustls::ClientConfig::builder();
}
