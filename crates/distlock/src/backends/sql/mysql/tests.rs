use super::*;
use crate::backend::{AcquireMode, Backend};
use crate::testkit::mysql::MariaDbServer;

/// Whether some session holds the doorbell of `name` (as the backend names it).
fn doorbell_held(db: &crate::testkit::mysql::TestDatabase, b: &MySqlBackend, n: &LockName) -> bool {
    let (region, key) = b.inner.row_key(n).unwrap();
    let bell = b.inner.doorbell(&region, &key);
    let rows = db.query(&format!("SELECT IS_USED_LOCK('{bell}')")).unwrap();
    rows[0][0].is_some()
}

/// One attempt of a caller that will wait.
async fn queued(b: &MySqlBackend, name: &LockName, token: Token, lease: Duration) -> Attempt {
    let request = AcquireRequest::new(name.clone(), token, lease);
    b.acquire(&request.with_mode(AcquireMode::Queue))
        .await
        .unwrap()
}

/// An uncontended hold rings nobody; once a waiter marked the lock wanted, the holder holds
/// the doorbell for exactly as long as it holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_holds_the_doorbell_while_the_lock_is_wanted() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    let holder = MySqlBackend::connect(db.url()).await.unwrap();
    let waiter = MySqlBackend::connect(db.url()).await.unwrap();
    let name = LockName::new("bell", "k").unwrap();
    let lease = Duration::from_secs(10);
    let (h, w) = (Token::random(), Token::random());

    assert!(matches!(
        queued(&holder, &name, h, lease).await,
        Attempt::Acquired { .. }
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !doorbell_held(&db, &holder, &name),
        "an uncontended hold took the doorbell"
    );
    // The waiter finds it busy (and marks it wanted).
    assert!(matches!(
        queued(&waiter, &name, w, lease).await,
        Attempt::Busy { .. }
    ));
    assert!(holder.release(&name, h).await.unwrap().contended);

    // Taken again while wanted: the doorbell is held with the lock, and given back with it.
    assert!(matches!(
        queued(&holder, &name, h, lease).await,
        Attempt::Acquired { .. }
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !doorbell_held(&db, &holder, &name) {
        assert!(
            std::time::Instant::now() < deadline,
            "the wanted hold never took the doorbell"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut sub = waiter.subscribe(&name, Token::random()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // the waiter's connection waits
    assert!(holder.release(&name, h).await.unwrap().was_held);
    assert!(
        !doorbell_held(&db, &holder, &name),
        "the release kept the doorbell"
    );
    tokio::time::timeout(Duration::from_millis(500), sub.released())
        .await
        .expect("the waiter was not rung");
    assert!(matches!(
        queued(&waiter, &name, w, lease).await,
        Attempt::Acquired { .. }
    ));
}
