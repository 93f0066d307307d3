//! Faults under read and permit holds: a server restarted empty, a holder stalled past its
//! lease, a short connection cut, and mutex scripts meeting a hash of another kind.

use super::*;

// Faults: never two incompatible holders at once without the stale one learning it is lost.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_and_permit_holders_learn_they_are_lost_when_redis_restarts_empty() {
    let mut server = RedisServer::start().expect("redis-server must be installed");
    let url = server.url();
    let reg = registry(&url, lease(600)).await;
    let r = reg.read_write("doc").unwrap().read().lock().await.unwrap();
    let p = reg.semaphore("pool", 1).unwrap().lock().await.unwrap();
    let fences = (r.fence(), p.fence());
    server.kill();
    server.restart().expect("restart on the same port");
    for (g, what) in [(&r, "reader"), (&p, "permit")] {
        tokio::time::timeout(Duration::from_secs(3), g.lost())
            .await
            .unwrap_or_else(|_| panic!("{what} not told its hold is gone after the restart"));
    }
    let other = registry(&url, lease(600)).await;
    let w = tokio::time::timeout(
        Duration::from_secs(5),
        other.read_write("doc").unwrap().write().lock(),
    )
    .await
    .expect("free after the restart")
    .unwrap();
    let q = other.semaphore("pool", 1).unwrap().lock().await.unwrap();
    assert!(
        w.fence() > fences.0 && q.fence() > fences.1,
        "fences after data loss"
    );
    assert!(matches!(r.release().await, Err(Error::LockLost { .. })));
    assert!(matches!(p.release().await, Err(Error::LockLost { .. })));
    w.release().await.unwrap();
    q.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_or_permit_holder_knows_it_lost_before_anyone_else_holds() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let stalled = registry(&format!("redis://{}", proxy.addr()), lease(400)).await;
    let healthy = registry(&server.url(), lease(400)).await;
    let r = distlock_testkit::holds::read(&stalled, "doc").await;
    let p = stalled.semaphore("pool", 1).unwrap().lock().await.unwrap();
    proxy.pause();
    let w = tokio::time::timeout(
        Duration::from_secs(5),
        healthy.read_write("doc").unwrap().write().lock(),
    )
    .await
    .expect("a writer gets the key once the stalled reader's lease ends")
    .unwrap();
    assert!(
        !r.is_held(),
        "a writer beside a reader that does not know it lost"
    );
    assert!(w.fence() > r.fence());
    let q = tokio::time::timeout(
        Duration::from_secs(5),
        healthy.semaphore("pool", 1).unwrap().lock(),
    )
    .await
    .expect("the stalled holder's permit comes back after its lease")
    .unwrap();
    assert!(
        !p.is_held(),
        "two holders of one permit, and the stale one does not know"
    );
    assert!(q.fence() > p.fence());
    proxy.resume();
    w.release().await.unwrap();
    q.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holds_survive_a_short_connection_cut() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let reg = registry(&format!("redis://{}", proxy.addr()), lease(1500)).await;
    let r = reg.read_write("doc").unwrap().read().lock().await.unwrap();
    let p = reg.semaphore("pool", 2).unwrap().lock().await.unwrap();
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.restore();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        r.is_held() && p.is_held(),
        "a brief cut within the lease lost a hold"
    );
    let other = registry(&server.url(), RegistryOptions::default()).await;
    busy(
        other.read_write("doc").unwrap().write().try_lock().await,
        "writer beside the reader",
    );
    r.release().await.unwrap();
    p.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_scripts_meeting_a_hash_answer_not_ours_and_renewals_mix_kinds() {
    use distlock::{AcquireMode, AcquireRequest, Attempt, LockName, Renewal, Token};
    let server = RedisServer::start().expect("redis-server must be installed");
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lease = Duration::from_secs(5);
    let name = |key: &str, kind| LockName::new("lock", key).unwrap().with_kind(kind);
    let (reader, permit, mutex) = (Token::random(), Token::random(), Token::random());
    let take = |n: LockName, t| AcquireRequest::new(n, t, lease);
    let read = name("doc", LockKind::Read);
    assert!(matches!(
        backend.acquire(&take(read.clone(), reader)).await.unwrap(),
        Attempt::Acquired { .. }
    ));
    // A mutex hold of this key that was lost (its token is not there): every mutex script
    // finds a hash and says "not ours".
    let m = name("doc", LockKind::Mutex);
    let queued = take(m.clone(), mutex).with_mode(AcquireMode::Queue);
    assert!(matches!(
        backend.acquire(&queued).await.unwrap(),
        Attempt::Busy { .. }
    ));
    assert!(!backend.release(&m, mutex).await.unwrap().was_held);
    assert!(!backend.extend(&m, mutex, lease).await.unwrap());
    backend.leave_queue(&m, mutex).await.unwrap();
    let sem = name("pool", LockKind::Semaphore { permits: 2 });
    assert!(matches!(
        backend.acquire(&take(sem.clone(), permit)).await.unwrap(),
        Attempt::Acquired { .. }
    ));
    let held = Token::random();
    let plain = name("plain", LockKind::Mutex);
    assert!(matches!(
        backend.acquire(&take(plain.clone(), held)).await.unwrap(),
        Attempt::Acquired { .. }
    ));
    let renew = |name: &LockName, token| Renewal {
        name: name.clone(),
        token,
        lease: Duration::from_secs(60),
    };
    let results: Vec<bool> = backend
        .extend_many(&[
            renew(&plain, held),
            renew(&read, reader),
            renew(&m, mutex),
            renew(&sem, permit),
            renew(&read, Token::random()),
        ])
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(results, [true, true, false, true, false]);
    let timeout = format!("{{lock:doc}}:{reader}:rwlock_timeout:1");
    for key in ["lock:plain", timeout.as_str(), "lock:pool"] {
        assert!(pttl(&server, key) > 5000, "{key} not renewed");
    }
}
