use super::*;
use crate::backend::{AcquireMode, AcquireRequest, Attempt, Backend, LockKind};
use crate::backends::sql::tests::{count_holds, number};
use distlock_testkit::mysql::MariaDbServer;

/// Whether some session holds the doorbell of `name` (as the backend names it).
fn doorbell_held(
    db: &distlock_testkit::mysql::TestDatabase,
    b: &MySqlBackend,
    n: &LockName,
) -> bool {
    let (region, key) = b.inner.row_key(n).unwrap();
    let bell = b.inner.doorbell(&region, &key);
    let rows = db.query(&format!("SELECT IS_USED_LOCK('{bell}')")).unwrap();
    rows[0][0].is_some()
}

/// A fresh database on the test server, and a backend on it.
async fn fresh() -> (distlock_testkit::mysql::TestDatabase, MySqlBackend) {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    let b = MySqlBackend::connect(db.url()).await.unwrap();
    (db, b)
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
    let (db, holder) = fresh().await;
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

/// Permit holders of two backends take and give back permits at once: every release finds
/// its permit (the statements' outcomes are read from the right statement of each packet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_permits_are_released_as_taken() {
    let server = MariaDbServer::machine_or_start().expect("mariadb-server");
    let db = server.fresh_database().unwrap();
    let backends = [
        MySqlBackend::connect(db.url()).await.unwrap(),
        MySqlBackend::connect(db.url()).await.unwrap(),
    ];
    let name = LockName::new("sem", "k")
        .unwrap()
        .with_kind(LockKind::Semaphore { permits: 3 });
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (b, name) = (backends[i % 2].clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let mut taken = 0;
            while taken < 20 {
                let token = Token::random();
                let request = AcquireRequest::new(name.clone(), token, Duration::from_secs(10));
                if let Attempt::Acquired { .. } = b.acquire(&request).await.unwrap() {
                    taken += 1;
                    let released = b.release(&name, token).await.unwrap();
                    assert!(
                        released.was_held,
                        "a permit taken was not there to give back"
                    );
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Counts the rows of the holds table of `db` (`places`: the waiting writers' only).
fn holds_of(db: &distlock_testkit::mysql::TestDatabase) -> impl Fn(bool) -> usize + Sync + '_ {
    move |places| number(db.query(&count_holds(places)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_share_ends_with_its_lease() {
    let (db, b) = fresh().await;
    let count = holds_of(&db);
    crate::backends::sql::kinds::checks::a_crashed_share_ends_with_its_lease(&b, &count).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_reader_is_joined_and_leaves_first() {
    let (db, b) = fresh().await;
    let count = holds_of(&db);
    crate::backends::sql::kinds::checks::a_lone_reader_is_joined_and_leaves_first(&b, &count, true)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_must_agree() {
    let (_db, b) = fresh().await;
    crate::backends::sql::kinds::checks::permits_must_agree(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_keeps_readers_out() {
    let (db, b) = fresh().await;
    let count = holds_of(&db);
    crate::backends::sql::kinds::checks::a_waiting_writer_keeps_readers_out(&b, &count).await;
}

/// A statement of a transaction packet that fails after the first is reported (not left
/// pending for the connection's next query), and leaves no transaction open on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_statement_in_a_transaction_is_reported_and_rolled_back() {
    let (db, b) = fresh().await;
    let failed = b
        .inner
        .run_transaction(
            "test",
            "START TRANSACTION; SELECT 1 FROM distlock_locks FOR UPDATE; \
             SELECT no_such_column FROM distlock_locks; COMMIT",
            false,
        )
        .await;
    assert!(failed.is_err(), "{:?}", failed.map(|o| o.statements));
    let open_transactions = || {
        db.query(&format!(
            "SELECT COUNT(*) FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = '{}'",
            db.name()
        ))
        .unwrap()
    };
    let open = open_transactions();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let open_later = open_transactions();
    assert_eq!(
        open_later[0][0].as_deref(),
        Some("0"),
        "a transaction stayed open (at first: {open:?})"
    );
    let name = LockName::new("t", "k").unwrap();
    let token = Token::random();
    let request = AcquireRequest::new(name.clone(), token, Duration::from_secs(5));
    assert!(matches!(
        b.acquire(&request).await.unwrap(),
        Attempt::Acquired { .. }
    ));
    assert!(b.release(&name, token).await.unwrap().was_held);
}

/// A waiter whose process's doorbell listener watches the lock is woken in its turn, so it
/// reports the in-line place that slows its polls; before it listens it reports none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_watched_by_its_listener_reports_the_in_line_place() {
    let (db, holder) = fresh().await;
    let waiter = MySqlBackend::connect(db.url()).await.unwrap();
    let name = LockName::new("pace", "k").unwrap();
    let lease = Duration::from_secs(10);
    let (h, w) = (Token::random(), Token::random());
    assert!(matches!(
        queued(&holder, &name, h, lease).await,
        Attempt::Acquired { .. }
    ));
    let before = queued(&waiter, &name, w, lease).await;
    assert!(
        matches!(before, Attempt::Busy { ahead: None, .. }),
        "{before:?}"
    );
    let _sub = waiter.subscribe(&name, w).await.unwrap();
    let watched = queued(&waiter, &name, w, lease).await;
    assert!(
        matches!(watched, Attempt::Busy { ahead: Some(a), .. } if a == super::doorbell::IN_LINE_AHEAD),
        "{watched:?}"
    );
    assert!(holder.release(&name, h).await.unwrap().was_held);
}
