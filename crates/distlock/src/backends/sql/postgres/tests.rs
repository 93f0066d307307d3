use super::*;
use crate::backend::{AcquireRequest, Backend};
use crate::backends::sql::tests::{count_holds, number};
use crate::backends::sql::DEFAULT_TABLE;
use distlock_testkit::postgres::{PostgresServer, TestDatabase};

/// A backend with a pool of `pool_size` on a fresh database, and the lock the tests use.
struct Setup {
    db: TestDatabase,
    b: PostgresBackend,
    name: LockName,
    /// The lock's row, the parameters of `Stmt::Inspect`.
    row: (String, String),
}

async fn setup(pool_size: usize) -> Setup {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    let db = server.fresh_database().unwrap();
    let url = format!("{}?sslmode=disable&pool_size={pool_size}", db.url());
    let b = PostgresBackend::connect(&url).await.unwrap();
    let name = LockName::new("pool", "k").unwrap();
    let row = b.inner.ident(&name).unwrap();
    Setup { db, b, name, row }
}

/// Takes `name` and gives it back through the whole `Backend` path.
async fn cycle(b: &PostgresBackend, name: &LockName) {
    let token = Token::random();
    let request = AcquireRequest::new(name.clone(), token, Duration::from_secs(10));
    let attempt = b.acquire(&request).await.unwrap();
    assert!(matches!(attempt, Attempt::Acquired { .. }), "{attempt:?}");
    assert!(b.release(name, token).await.unwrap().was_held);
}

/// A dropped lease table is created again by the next operation, and the idle connections,
/// whose prepared statements name the old table, are closed rather than lent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_table_empties_the_pool_and_comes_back() {
    let s = setup(4).await;
    let (b, name, (x, y)) = (&s.b, &s.name, &s.row);
    // Four connections at once, each with a statement prepared on it.
    let loans = futures_util::future::try_join_all((0..4).map(|_| b.inner.loan("test")))
        .await
        .unwrap();
    for loan in &loans {
        b.inner
            .run_once(loan.client(), Stmt::Inspect, &[x, y])
            .await
            .unwrap();
    }
    drop(loans);
    assert_eq!(b.inner.pool.status().size, 4);

    s.db.query(&format!("DROP TABLE \"{DEFAULT_TABLE}\""))
        .unwrap();
    cycle(b, name).await;
    let status = b.inner.pool.status();
    assert_eq!(
        status.size, 1,
        "connections prepared against the dropped table stayed in the pool: {status:?}"
    );
    cycle(b, name).await;
}

/// A connection whose statement was still under way when its call was given up is closed, not
/// lent again (its late reply must not reach the next borrower); the next call works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_cut_off_closes_its_connection() {
    let s = setup(2).await;
    let (b, name, (x, y)) = (&s.b, &s.name, &s.row);
    assert_eq!(
        b.inner.pool.status().size,
        1,
        "connect keeps its connection"
    );

    // Another session locks the table, so that the statement cannot finish however long the
    // call waits: the cut-off below does not race the server.
    let refused = Arc::new(AtomicBool::new(false));
    let Ok((blocker, mut messages)) = b.inner.pool.manager().open(refused).await else {
        panic!("a second session could not connect");
    };
    let driver = tokio::spawn(async move {
        use futures_util::StreamExt;
        while let Some(Ok(_)) = messages.next().await {}
    });
    blocker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE \"{DEFAULT_TABLE}\" IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        b.inner.query("inspect", Stmt::Inspect, &[x, y], true),
    )
    .await;
    assert!(cut.is_err(), "the statement finished behind a table lock");
    let status = b.inner.pool.status();
    assert_eq!(
        status.size, 0,
        "the cut-off connection went back: {status:?}"
    );

    blocker.batch_execute("COMMIT").await.unwrap();
    drop(blocker);
    driver.await.unwrap();
    cycle(b, name).await;
    assert_eq!(b.inner.pool.status().size, 1);
}

/// Counts the rows of the holds table of `db` (`places`: the waiting writers' only).
fn holds_of(db: &TestDatabase) -> impl Fn(bool) -> usize + Sync + '_ {
    move |places| number(db.query(&count_holds(places)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_share_ends_with_its_lease() {
    let s = setup(2).await;
    let count = holds_of(&s.db);
    crate::backends::sql::kinds::checks::a_crashed_share_ends_with_its_lease(&s.b, &count).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_reader_is_joined_and_leaves_first() {
    let s = setup(2).await;
    let count = holds_of(&s.db);
    crate::backends::sql::kinds::checks::a_lone_reader_is_joined_and_leaves_first(
        &s.b, &count, true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_must_agree() {
    let s = setup(2).await;
    crate::backends::sql::kinds::checks::permits_must_agree(&s.b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_keeps_readers_out() {
    let s = setup(2).await;
    let count = holds_of(&s.db);
    crate::backends::sql::kinds::checks::a_waiting_writer_keeps_readers_out(&s.b, &count).await;
}

/// A share statement that finds the key's row changed since its snapshot changes nothing and
/// says so; the operation then runs after the row lock. Here another session changes the row
/// (as a concurrent share operation would) while the statement waits for the row lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_statement_on_a_changing_row_defers_to_the_row_lock() {
    let s = setup(2).await;
    let read = s.name.clone().with_kind(crate::backend::LockKind::Read);
    let (a, b) = s.b.inner.ident(&read).unwrap();
    // The row exists (a first share), and is free again.
    let first = Token::random();
    let request = AcquireRequest::new(read.clone(), first, Duration::from_secs(10));
    assert!(matches!(
        s.b.acquire(&request).await.unwrap(),
        Attempt::Acquired { .. }
    ));
    assert!(s.b.release(&read, first).await.unwrap().was_held);

    let refused = Arc::new(AtomicBool::new(false));
    let Ok((blocker, mut messages)) = s.b.inner.pool.manager().open(refused).await else {
        panic!("a second session could not connect");
    };
    let driver = tokio::spawn(async move {
        use futures_util::StreamExt;
        while let Some(Ok(_)) = messages.next().await {}
    });
    blocker
        .batch_execute(&format!(
            "BEGIN; UPDATE \"{DEFAULT_TABLE}\" SET created_ms = created_ms + 1 \
             WHERE region = '{a}' AND lock_key = '{b}'"
        ))
        .await
        .unwrap();
    let token = Token::random();
    let (owner, lease) = (token.to_string(), 10_000i64);
    let (code, permits, mark) = ("r", 0i32, crate::backends::sql::kinds::READ_MARK);
    let inner = s.b.inner.clone();
    let (a2, b2) = (a.clone(), b.clone());
    let statement = tokio::spawn(async move {
        inner
            .query(
                "test",
                Stmt::AcquireShareNow,
                &[
                    &a2,
                    &b2,
                    &owner,
                    &lease,
                    &WANT_WINDOW_MS,
                    &code,
                    &permits,
                    &mark,
                    &"test:1",
                ],
                true,
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !statement.is_finished(),
        "the statement did not wait for the row lock"
    );
    blocker.batch_execute("COMMIT").await.unwrap();
    let rows = statement.await.unwrap().unwrap();
    assert!(
        !rows[0].get::<_, bool>(0),
        "a stale snapshot counted as settled"
    );
    assert_eq!(
        s.b.inspect(&read).await.unwrap(),
        None,
        "the unsettled statement took the lock"
    );
    drop(blocker);
    driver.await.unwrap();
    // Through the backend, the attempt then runs after the row lock.
    let request = AcquireRequest::new(read.clone(), token, Duration::from_secs(10));
    assert!(matches!(
        s.b.acquire(&request).await.unwrap(),
        Attempt::Acquired { .. }
    ));
    assert!(s.b.release(&read, token).await.unwrap().was_held);
}
