//! `rediss+sentinel://` and `rediss+cluster://`: Sentinel and Cluster whose every link is TLS
//! (clients, replication, Sentinel's links, the cluster bus), with a private CA made for the
//! test by the testkit's `TestCa`. The servers also keep a plain port, for the testkit's own commands only.

use std::sync::Arc;
use std::time::Duration;

use distlock::backends::redis::RedisBackend;
use distlock::{Error, LockGuard, LockRegistry, RegistryOptions};
use distlock_testkit::redis::cluster::ClusterSet;
use distlock_testkit::redis::sentinel::SentinelSet;
use distlock_testkit::tls::TestCa;

fn certs() -> TestCa {
    TestCa::new(&["localhost", "127.0.0.1"], "distlock").expect("test CA")
}

fn with_ca(url: &str, certs: &TestCa) -> String {
    format!("{url}?ca_file={}", certs.ca_cert().display())
}

async fn registry(url: &str) -> LockRegistry {
    let backend = RedisBackend::connect(url).await.expect("TLS connect");
    LockRegistry::from_backend(
        Arc::new(backend),
        RegistryOptions::default().with_lease(Duration::from_secs(15)),
    )
    .unwrap()
}

/// `key`'s lock, retried while it fails as `Unavailable` (a failover under way, or an
/// acquisition that no replica acknowledged in time, whose token the registry gave back).
async fn take(reg: &LockRegistry, key: &str) -> LockGuard {
    for _ in 0..100 {
        match reg.obtain(key).unwrap().lock().await {
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            r => return r.expect("acquired"),
        }
    }
    panic!("{key}: still unavailable after 10 s")
}

/// A `try_lock` of `key`, retried while it fails as `Unavailable`.
async fn try_take(reg: &LockRegistry, key: &str) -> distlock::Result<LockGuard> {
    for _ in 0..100 {
        match reg.obtain(key).unwrap().try_lock().await {
            Err(Error::Unavailable { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            r => return r,
        }
    }
    panic!("{key}: still unavailable after 10 s")
}

/// Mutual exclusion, a waiter woken by a release (pub/sub over TLS too), and increasing fences
/// between two clients of `url`.
async fn excludes_and_hands_over(url: &str, key: &str) {
    let one = registry(url).await;
    let two = Arc::new(registry(url).await);
    let g = take(&one, key).await;
    assert!(matches!(
        try_take(&two, key).await,
        Err(Error::NotAcquired { .. })
    ));
    let waiter = {
        let two = two.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            let g = take(&two, &key).await;
            let fence = g.fence();
            g.release().await.unwrap();
            fence
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fence = g.fence();
    g.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is handed the lock")
        .unwrap();
    assert!(next > fence, "fence {next} after {fence}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_locks_and_follows_a_failover() {
    let certs = certs();
    let set = tokio::task::block_in_place(|| SentinelSet::start_tls(2, certs.dir()))
        .expect("a TLS Sentinel set");
    let url = with_ca(&set.url(), &certs);
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    excludes_and_hands_over(&format!("{url}&min_replicas=1"), "tls-job").await;

    // A hold taken before a failover is kept by the promoted replica, over TLS throughout.
    let holder = registry(&format!("{url}&min_replicas=1")).await;
    let other = registry(&format!("{url}&min_replicas=1")).await;
    let g = take(&holder, "job").await;
    let first = g.fence();
    let old = set.master();
    tokio::task::block_in_place(|| set.failover()).expect("SENTINEL FAILOVER");
    tokio::task::block_in_place(|| set.await_replicas(1)).expect("a replica follows");
    assert!(matches!(
        try_take(&other, "job").await,
        Err(Error::NotAcquired { .. })
    ));
    assert_ne!(set.master(), old);
    assert!(g.is_held(), "the acknowledged hold survives the failover");
    g.release().await.unwrap();
    let next = take(&other, "job").await;
    assert!(next.fence() > first, "fence {} after {first}", next.fence());
    next.release().await.unwrap();

    // Without the private CA the Sentinels' certificates are not trusted: a clear error, not
    // a hang, and not a configuration error.
    let untrusted = RedisBackend::connect(&set.url()).await.unwrap_err();
    assert!(
        format!("{untrusted}").contains("TLS") && !matches!(untrusted, Error::InvalidConfig(_)),
        "{untrusted:?}"
    );
    // A plain client of the TLS ports does not get through either.
    let plain = set.url().replacen("rediss+sentinel", "redis+sentinel", 1);
    assert!(RedisBackend::connect(&plain).await.is_err());
    for (url, part) in [
        (
            format!("{plain}?ca_file={}", certs.ca_cert().display()),
            "needs TLS",
        ),
        (
            format!("{}?ca_file=/no/such/ca.pem", set.url()),
            "cannot be read",
        ),
        (format!("{}?ca_file=/etc/hostname", set.url()), "no PEM"),
    ] {
        match RedisBackend::connect(&url).await {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(part), "{url}: {msg}"),
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_routes_every_shard_and_follows_a_failover() {
    let certs = certs();
    let mut set = tokio::task::block_in_place(|| ClusterSet::start_tls(3, 1, certs.dir()))
        .expect("a TLS cluster");
    let url = with_ca(&set.url(), &certs);
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    // Keys on every master.
    let mut masters = Vec::new();
    let mut keys = Vec::new();
    for i in 0.. {
        let key = format!("tls-{i}");
        let slot = set.slot_of(&format!("lock:{key}")).unwrap();
        let master = set.master_of(slot).unwrap();
        if !masters.contains(&master) {
            masters.push(master);
            keys.push(key);
        }
        if masters.len() == 3 {
            break;
        }
    }
    for key in &keys {
        excludes_and_hands_over(&url, key).await;
    }

    // A hold across a manual failover of its shard's master.
    let holder = registry(&format!("{url}&min_replicas=1")).await;
    let other = registry(&format!("{url}&min_replicas=1")).await;
    let g = take(&holder, &keys[0]).await;
    let first = g.fence();
    let slot = set.slot_of(&format!("lock:{}", keys[0])).unwrap();
    let master = set.master_of(slot).unwrap();
    tokio::task::block_in_place(|| set.failover(master)).expect("CLUSTER FAILOVER");
    assert_ne!(set.master_of(slot), Some(master));
    assert!(matches!(
        try_take(&other, &keys[0]).await,
        Err(Error::NotAcquired { .. })
    ));
    assert!(g.is_held());
    g.release().await.unwrap();
    let next = take(&other, &keys[0]).await;
    assert!(next.fence() > first, "fence {} after {first}", next.fence());
    next.release().await.unwrap();

    let untrusted = RedisBackend::connect(&set.url()).await.unwrap_err();
    assert!(
        !matches!(untrusted, Error::InvalidConfig(_)),
        "{untrusted:?}"
    );
}
