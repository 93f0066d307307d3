//! Access and set-up: digest authentication, bad URLs and unreachable servers, leases the
//! server cannot grant, credentials over plain TCP.

use super::*;

/// Digest credentials: nodes get the CREATOR_ALL ACL, so a client without them can neither
/// take nor queue for the lock; the password never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_authentication_protects_the_nodes() {
    let server = shared();
    let r = root();
    let with = |cred: &str| {
        format!(
            "zk://{cred}127.0.0.1:{}{r}?allow_insecure_auth=true",
            server.port()
        )
    };
    let alice = backend(&with("alice:s3cr%40t@")).await;
    assert!(!format!("{alice:?}").contains("s3cr"), "{alice:?}");
    let g = registry(&alice, RegistryOptions::default())
        .obtain("k")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let acl = acl(&alice, &format!("{r}/k")).await;
    assert_eq!(acl.len(), 1);
    assert_eq!(acl[0].scheme(), "digest");
    assert!(acl[0].id().starts_with("alice:"), "{:?}", acl[0]);

    let anonymous = registry(&backend(&with("")).await, RegistryOptions::default());
    let err = anonymous.obtain("k").unwrap().try_lock().await.unwrap_err();
    assert!(
        matches!(&err, Error::Backend { message, .. } if message.contains("permission")),
        "{err:?}"
    );
    let mallory = registry(
        &backend(&with("alice:wrong@")).await,
        RegistryOptions::default(),
    );
    assert!(matches!(
        mallory.obtain("k").unwrap().try_lock().await,
        Err(Error::Backend { .. })
    ));
    let alice2 = registry(
        &backend(&with("alice:s3cr%40t@")).await,
        RegistryOptions::default(),
    );
    assert!(matches!(
        alice2.obtain("k").unwrap().try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
    g.release().await.unwrap();
    lock_and_release(&alice2, "k").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_servers_are_typed_errors() {
    for url in ["zk://", "zk://127.0.0.1:x", "zk://127.0.0.1:1/a//b"] {
        assert!(
            matches!(
                ZooKeeperBackend::connect(url).await,
                Err(Error::InvalidConfig(_))
            ),
            "{url}"
        );
    }
    let started = Instant::now();
    let err = distlock::connect("zk://127.0.0.1:1?connect_timeout=1s")
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// A lease outside the session timeouts the server grants (its minSessionTimeout..
/// maxSessionTimeout, 200 ms..1 h here) is a configuration error, and leaves nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_server_cannot_grant_is_a_config_error() {
    let server = shared();
    let b = backend(&format!("{}{}", server.url(), root())).await;
    for ms in [2 * 3_600_000, 100] {
        let err = registry(&b, lease(ms))
            .obtain("k")
            .unwrap()
            .try_lock()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig(m) if m.contains("session")),
            "lease {ms} ms: {err:?}"
        );
    }
    assert!(b
        .contenders(&LockName::new("lock", "k").unwrap())
        .await
        .unwrap()
        .is_empty());
    // A lease the server grants works.
    lock_and_release(&registry(&b, lease(1000)), "k").await;
}

/// A password goes over plain TCP only when the URL says so (`allow_insecure_auth=true`); without
/// it, the URL is refused with a configuration error that does not show the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_over_plain_tcp_need_the_explicit_opt_in() {
    let server = shared();
    let url = format!("zk://alice:hunter2@127.0.0.1:{}{}", server.port(), root());
    let err = ZooKeeperBackend::connect(&url).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("allow_insecure_auth")),
        "{err:?}"
    );
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    let b = backend(&format!("{url}?allow_insecure_auth=true")).await;
    lock_and_release(&registry(&b, RegistryOptions::default()), "k").await;
}
