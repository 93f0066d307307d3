//! Fault tests of the PostgreSQL and MariaDB backends on real servers: connections killed by
//! the server mid-hold, the lock row deleted underneath, PostgreSQL restarted mid-hold (only on
//! a throwaway server this test starts), tables created by many processes at once, and a
//! stalled network. The check is always the same: never two holders at once without the stale
//! one learning it is lost, and fences always tell the stale one. Passwords and TLS are in
//! `sql_auth.rs`.

mod common {
    pub mod fifo;
    pub mod sql;
}

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::fifo::spawn_waiter;
use common::sql::*;
use distlock::backends::sql::DEFAULT_REQUEST_TIMEOUT;
use distlock::{AcquireRequest, Attempt, Error, LockName, LockRegistry, Token};
use distlock_testkit::postgres::PostgresServer;
use distlock_testkit::proxy::FaultProxy;

/// The holder keeps its lock across the server killing every connection: renewal reconnects.
async fn renewal_survives_killed_connections(db: &SqlDb) {
    let holder = registry(db.backend().await, opts(600));
    let other = registry(db.backend().await, opts(600));
    let guard = holder.obtain("job").unwrap().lock().await.unwrap();
    for _ in 0..3 {
        assert!(db.kill_connections() > 0, "no connection was killed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            guard.is_held(),
            "lost the lock after its connections were killed"
        );
        assert!(matches!(
            other.obtain("job").unwrap().try_lock().await,
            Err(Error::NotAcquired { .. })
        ));
    }
    guard.extend(Duration::from_millis(600)).await.unwrap();
    guard.release().await.unwrap();
    distlock_testkit::holds::free(&other, "job", "free after release").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_renewal_survives_pg_terminate_backend() {
    renewal_survives_killed_connections(&SqlDb::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_renewal_survives_kill() {
    renewal_survives_killed_connections(&SqlDb::mariadb()).await;
}

/// Two registries on `db` with 5 s leases: a holder, and a waiter that polls only every 10 s
/// (so that only a notification wakes it in time).
async fn holder_and_slow_waiter(db: &SqlDb) -> (LockRegistry, LockRegistry) {
    let holder = registry(db.backend().await, opts(5000));
    let waiter = registry(
        db.backend().await,
        opts(5000).with_max_poll_interval(Duration::from_secs(10)),
    );
    (holder, waiter)
}

/// The listening connection is killed too; once it is back, a release still wakes a waiter
/// that would otherwise not poll for ten seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notifications_resume_after_the_listener_is_killed() {
    let db = SqlDb::postgres();
    let (holder, waiter) = holder_and_slow_waiter(&db).await;
    let guard = holder.obtain("k").unwrap().lock().await.unwrap();
    let lock = waiter.obtain("k").unwrap();
    let waiting = tokio::spawn(async move { lock.lock().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(db.kill_connections() >= 2, "holder, waiter and listener");
    // Let the listener reconnect (it wakes the waiter, which finds the lock still held).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished());
    let released = tokio::time::Instant::now();
    guard.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter was not woken after the listener came back")
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by polling, not by NOTIFY: {:?}",
        released.elapsed()
    );
    got.release().await.unwrap();
}

/// A waiter of another backend (another process, as far as the server can tell) is woken by
/// the holder's doorbell, not by polling, also after every connection was killed mid-wait.
async fn mariadb_doorbell_wakes(kill: bool) {
    let db = SqlDb::mariadb();
    let (holder, waiter) = holder_and_slow_waiter(&db).await;
    for round in 0..3 {
        let guard = holder.obtain("k").unwrap().lock().await.unwrap();
        let lock = waiter.obtain("k").unwrap();
        let waiting = tokio::spawn(async move { lock.lock().await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if kill && round == 1 {
            assert!(
                db.kill_connections() >= 3,
                "pool, doorbell and waiter connections"
            );
            // The doorbell connection is replaced within about a second and takes the
            // doorbell again; the waiter must not take the lock meanwhile.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        assert!(!waiting.is_finished(), "the waiter got a held lock");
        let released = tokio::time::Instant::now();
        guard.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .expect("the waiter was not woken")
            .unwrap()
            .unwrap();
        assert!(
            released.elapsed() < Duration::from_millis(500),
            "round {round}: woken by polling, not by the doorbell: {:?}",
            released.elapsed()
        );
        got.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_doorbell_wakes_waiters_of_other_processes() {
    mariadb_doorbell_wakes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_doorbell_survives_killed_connections() {
    mariadb_doorbell_wakes(true).await;
}

/// Waiters in three processes (three backends) get the lock in the order they came: the
/// turnstile wakes one process per release, the next in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_waiting_processes_are_served_in_arrival_order() {
    let db = my_db();
    let holder = registry(my(db.url()).await, opts(5000));
    let guard = holder.obtain("line").unwrap().lock().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        // No polling: only the doorbell and the turnstile can hand the lock on.
        let reg = registry(
            my(db.url()).await,
            opts(5000).with_max_poll_interval(Duration::from_secs(10)),
        );
        waiters.push(spawn_waiter(
            reg,
            "line",
            i,
            &order,
            Duration::from_millis(100),
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    guard.release().await.unwrap();
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("a waiter was never served")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
}

/// Deleting the row underneath the holder: the holder learns it is lost, and the next holder's
/// fence is still larger (it follows the server's clock).
async fn deleted_row(db: &SqlDb) {
    let holder = registry(db.backend().await, opts(600));
    let other = registry(db.backend().await, opts(600));
    let guard = holder.obtain("row").unwrap().lock().await.unwrap();
    let old_fence = guard.fence();
    db.query("DELETE FROM distlock_locks").unwrap();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the holder was not told its row is gone");
    let next = other.obtain("row").unwrap().try_lock().await.unwrap();
    assert!(
        next.fence() > old_fence,
        "fence {} after the row was deleted is not above {old_fence}",
        next.fence()
    );
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_row_deleted_underneath() {
    deleted_row(&SqlDb::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_row_deleted_underneath() {
    deleted_row(&SqlDb::mariadb()).await;
}

/// PostgreSQL crashes and comes back mid-hold, on a throwaway server of this test's own: the
/// holder is told as soon as its renewals cannot confirm the lease, and the next holder's
/// fence tells the stale one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_hold_is_reported_to_the_holder() {
    let server = Arc::new(PostgresServer::start().expect("postgresql"));
    let db = server.fresh_database().unwrap();
    let holder = registry(pg(db.url()).await, opts(800));
    let guard = holder.obtain("job").unwrap().lock().await.unwrap();
    let old_fence = guard.fence();

    server.stop();
    let stopped = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the holder was not told that its renewals fail");
    assert!(
        stopped.elapsed() < Duration::from_millis(1000),
        "told only after {:?}",
        stopped.elapsed()
    );
    server.start_again().expect("postgres comes back");

    // Longer leases from here on: this part checks fences and reconnection, not timing.
    let other = registry(pg(db.url()).await, opts(5000));
    let next = tokio::time::timeout(Duration::from_secs(5), other.obtain("job").unwrap().lock())
        .await
        .expect("the lock is free once the old lease has ended")
        .unwrap();
    assert!(next.fence() > old_fence);
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    next.release().await.unwrap();
    // The holder's backend reconnects by itself as well.
    let again = holder
        .obtain("job")
        .unwrap()
        .with_lease(Duration::from_secs(5))
        .unwrap()
        .try_lock_for(Duration::from_secs(5))
        .await
        .unwrap();
    again.release().await.unwrap();
}

/// Many processes (backends) start at once on an empty database: the table is created once,
/// nobody fails, and exactly one of them gets the lock.
async fn concurrent_first_use(db: &SqlDb, url: &str) {
    let connect = db.connector();
    let connecting: Vec<_> = (0..8).map(|_| tokio::spawn(connect(url))).collect();
    let mut backends = Vec::new();
    for c in connecting {
        backends.push(c.await.unwrap());
    }
    let name = LockName::new("lock", "first").unwrap();
    let tasks: Vec<_> = backends
        .into_iter()
        .map(|b| {
            let name = name.clone();
            tokio::spawn(async move {
                b.acquire(&AcquireRequest::new(
                    name.clone(),
                    Token::random(),
                    Duration::from_secs(10),
                ))
                .await
            })
        })
        .collect();
    let mut winners = 0;
    for t in tasks {
        if let Attempt::Acquired { .. } = t.await.unwrap().expect("no error on first use") {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_table_created_once_by_concurrent_first_users() {
    let db = SqlDb::postgres();
    let url = format!("{}?table=Shared_Locks&schema=infra", db.url());
    concurrent_first_use(&db, &url).await;
    let rows = db.query("SELECT count(*) FROM infra.shared_locks").unwrap();
    assert_eq!(
        rows[0][0].as_deref(),
        Some("1"),
        "table and schema as configured"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_table_created_once_by_concurrent_first_users() {
    let db = my_db();
    let other = db.server().fresh_database().unwrap();
    let url = format!("{}?table=Shared_Locks&schema={}", db.url(), other.name());
    concurrent_first_use(&SqlDb::MariaDb(db), &url).await;
    let rows = other.query("SELECT COUNT(*) FROM Shared_Locks").unwrap();
    assert_eq!(
        rows[0][0].as_deref(),
        Some("1"),
        "table in the configured schema"
    );
}

/// With the network to the server stalled (packets held, nothing closed), `try_lock_for(1 s)`
/// returns within its wait plus the request timeout instead of blocking for minutes; the
/// stalled connection is closed, not reused, and once the network is back the next call works
/// on a fresh connection.
async fn stalled_server_bounds_try_lock_for(db: &SqlDb) {
    let (proxy, via) = through_a_proxy(db).await;
    let reg = registry(db.connector()(&via).await, opts(30_000));
    // The round trip through the proxy, for the bound.
    let mut round_trip = Duration::ZERO;
    for _ in 0..3 {
        let t = tokio::time::Instant::now();
        let g = reg.obtain("warm").unwrap().try_lock().await.unwrap();
        g.release().await.unwrap();
        round_trip = round_trip.max(t.elapsed() / 2);
    }
    let before = db.sessions();
    assert!(!before.is_empty());

    proxy.pause();
    let wait = Duration::from_secs(1);
    let bound = wait + DEFAULT_REQUEST_TIMEOUT + Duration::from_secs(1) + round_trip * 20;
    let started = tokio::time::Instant::now();
    let lock = reg.obtain("k").unwrap();
    let outcome =
        tokio::time::timeout(bound + Duration::from_secs(20), lock.try_lock_for(wait)).await;
    let took = started.elapsed();
    let result = outcome.unwrap_or_else(|_| {
        panic!("try_lock_for({wait:?}) still blocked after {took:?} with the server stalled")
    });
    assert!(
        took <= bound,
        "try_lock_for({wait:?}) took {took:?} with the server stalled (bound {bound:?})"
    );
    assert!(
        matches!(&result, Err(e) if e.is_retryable()),
        "{:?}",
        result.map(|g| g.fence())
    );

    // The caller stopped waiting at its deadline, but its attempt runs on in the background
    // until the request timeout: the stall outlasts that, so the stalled connection is the one
    // that must be given up (a stall that ended earlier would simply let it answer).
    tokio::time::sleep_until(started + DEFAULT_REQUEST_TIMEOUT + Duration::from_secs(1)).await;
    proxy.resume();
    let g = tokio::time::timeout(
        Duration::from_secs(10),
        lock.try_lock_for(Duration::from_secs(5)),
    )
    .await
    .expect("the next call hangs after the stall ended")
    .expect("the next call works after the stall ended");
    g.release().await.unwrap();
    stalled_session_is_gone(&before, db).await;
}

/// A proxy in front of `db`'s server, and `db`'s URL through it.
async fn through_a_proxy(db: &SqlDb) -> (FaultProxy, String) {
    let proxy = FaultProxy::start(server_addr(db.url())).await.unwrap();
    let via = with_host(db.url(), "127.0.0.1", proxy.addr().port()).to_string();
    (proxy, via)
}

/// Waits until one of the sessions seen `before` a stall has ended on the server: the client
/// closed the stalled connection (the proxy passes the close on once it forwards again)
/// instead of using it again.
async fn stalled_session_is_gone(before: &BTreeSet<String>, db: &SqlDb) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let after = db.sessions();
        if before.iter().any(|s| !after.contains(s)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled connection was kept: sessions before {before:?}, after {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_try_lock_for_is_bounded_when_the_server_stalls() {
    stalled_server_bounds_try_lock_for(&SqlDb::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_try_lock_for_is_bounded_when_the_server_stalls() {
    stalled_server_bounds_try_lock_for(&SqlDb::mariadb()).await;
}

/// A holder whose renewals meet a stalled server is told it lost the lock no later than its
/// own reckoning of the lease ends; the connection of the stalled renewal is closed, not
/// reused, and the backend works again once the network is back.
async fn stalled_renewal_is_lost_by_the_lease_end(db: &SqlDb) {
    let (proxy, via) = through_a_proxy(db).await;
    let lease = Duration::from_millis(1500);
    let reg = registry(db.connector()(&via).await, opts(1500));
    let lock = reg.obtain("held").unwrap();
    let asked = tokio::time::Instant::now();
    let guard = lock.lock().await.unwrap();
    let before = db.sessions();
    proxy.pause();
    // The client counts the lease from before its request: it ends by `asked + lease`. A few
    // milliseconds allow for the timer that reports it.
    tokio::time::timeout_at(asked + lease + Duration::from_millis(50), guard.lost())
        .await
        .expect("the holder was not told by the end of its lease");
    assert!(!guard.is_held());
    drop(guard);
    // Stay stalled until the renewal's own limit (its lease, counted from when it was sent
    // at about a third of the first lease) has passed for sure.
    tokio::time::sleep_until(asked + lease * 2).await;
    proxy.resume();
    let next = tokio::time::timeout(
        Duration::from_secs(10),
        lock.try_lock_for(Duration::from_secs(5)),
    )
    .await
    .expect("the backend hangs after the stall")
    .expect("the backend works after the stall");
    next.release().await.unwrap();
    stalled_session_is_gone(&before, db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stalled_renewal_is_lost_by_the_lease_end() {
    stalled_renewal_is_lost_by_the_lease_end(&SqlDb::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_stalled_renewal_is_lost_by_the_lease_end() {
    stalled_renewal_is_lost_by_the_lease_end(&SqlDb::mariadb()).await;
}

/// A reader keeps its share across the server killing every connection (renewal reconnects),
/// and a writer of another backend stays out all along; after the reader leaves, the writer
/// gets in.
async fn read_hold_survives_killed_connections(db: &SqlDb) {
    let reader = registry(db.backend().await, opts(600));
    let writer = registry(db.backend().await, opts(600));
    let guard = distlock_testkit::holds::read(&reader, "shared").await;
    for _ in 0..3 {
        assert!(db.kill_connections() > 0, "no connection was killed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            guard.is_held(),
            "lost the share after its connections were killed"
        );
        assert!(matches!(
            writer
                .read_write("shared")
                .unwrap()
                .write()
                .try_lock()
                .await,
            Err(Error::NotAcquired { .. })
        ));
    }
    guard.release().await.unwrap();
    writer
        .read_write("shared")
        .unwrap()
        .write()
        .try_lock()
        .await
        .expect("free after the reader left")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_read_hold_survives_pg_terminate_backend() {
    read_hold_survives_killed_connections(&SqlDb::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_read_hold_survives_kill() {
    read_hold_survives_killed_connections(&SqlDb::mariadb()).await;
}

/// PostgreSQL crashes and comes back while a reader and a permit holder hold: both are told
/// before their leases end, a writer and another permit taker get in only after the old leases
/// ended (once the server is back), and their fences tell the stale holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_share_is_reported_to_the_holders() {
    use distlock_testkit::timing::scheduling_slack;
    let server = Arc::new(PostgresServer::start().expect("postgresql"));
    let db = server.fresh_database().unwrap();
    let lease = Duration::from_millis(800);
    let holder = registry(pg(db.url()).await, opts(800));
    let read = distlock_testkit::holds::read(&holder, "shared").await;
    let permit = holder.semaphore("pool", 2).unwrap().lock().await.unwrap();
    let (read_fence, permit_fence) = (read.fence(), permit.fence());

    server.stop();
    let stopped = tokio::time::Instant::now();
    let slack = scheduling_slack().await;
    for g in [&read, &permit] {
        tokio::time::timeout(lease + slack, g.lost())
            .await
            .expect("a holder was not told that its renewals fail");
    }
    server.start_again().expect("postgres comes back");

    let other = registry(pg(db.url()).await, opts(5000));
    let writer = tokio::time::timeout(
        Duration::from_secs(5) + slack,
        other.read_write("shared").unwrap().write().lock(),
    )
    .await
    .expect("the share outlived its lease")
    .unwrap();
    assert!(
        stopped.elapsed() >= lease,
        "a writer got in before the reader's lease ended"
    );
    assert!(writer.fence() > read_fence);
    let permits = other.semaphore("pool", 2).unwrap();
    let (p1, p2) = (permits.lock().await.unwrap(), permits.lock().await.unwrap());
    assert!(p1.fence() > permit_fence && p2.fence() > permit_fence);
    assert!(matches!(read.release().await, Err(Error::LockLost { .. })));
    assert!(matches!(
        permit.release().await,
        Err(Error::LockLost { .. })
    ));
    for g in [writer, p1, p2] {
        g.release().await.unwrap();
    }
}

/// Waiters of every kind in another backend (another process, as far as the server can tell)
/// are woken when a share or a permit goes, not by polling (their polls are 10 s apart): a
/// writer waiting for the last reader, a reader waiting for a writer that gave up its place,
/// a permit taker waiting for a permit.
async fn waiters_of_every_kind_are_woken(db: &SqlDb) {
    use distlock_testkit::timing::scheduling_slack;
    let (holder, waiter) = holder_and_slow_waiter(db).await;
    let woken = |at: tokio::time::Instant, what: &str, slack: Duration| {
        assert!(
            at.elapsed() < slack,
            "{what}: woken after {:?}, by polling rather than a notification",
            at.elapsed()
        );
    };

    // A writer waiting for a reader.
    let read = distlock_testkit::holds::read(&holder, "rw").await;
    let rw = waiter.read_write("rw").unwrap();
    let waiting = tokio::spawn(async move { rw.write().lock().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a writer beside a reader");
    let slack = scheduling_slack().await;
    let released = tokio::time::Instant::now();
    read.release().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the writer was not woken")
        .unwrap()
        .unwrap();
    woken(released, "writer", slack);
    w.release().await.unwrap();

    // A permit taker waiting for a permit.
    let sem = holder.semaphore("sem", 1).unwrap();
    let permit = sem.lock().await.unwrap();
    let other = waiter.semaphore("sem", 1).unwrap();
    let waiting = tokio::spawn(async move { other.lock().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "two holders of one permit");
    let slack = scheduling_slack().await;
    let released = tokio::time::Instant::now();
    permit.release().await.unwrap();
    let p = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the permit taker was not woken")
        .unwrap()
        .unwrap();
    woken(released, "permit taker", slack);
    p.release().await.unwrap();

    // A reader kept out by a waiting writer (of a third backend) that gives up.
    let read = distlock_testkit::holds::read(&holder, "gone").await;
    let third = registry(db.backend().await, opts(5000));
    let writer = third.read_write("gone").unwrap();
    let giving_up =
        tokio::spawn(async move { writer.write().try_lock_for(Duration::from_secs(1)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rw = waiter.read_write("gone").unwrap();
    let waiting = tokio::spawn(async move { rw.read().lock().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a reader came in behind a waiting writer"
    );
    assert!(
        giving_up.await.unwrap().is_err(),
        "the writer got in beside a reader"
    );
    // A deadline that passes while an attempt is in flight leaves the place once the attempt
    // ends, in the background: the wake-up is counted from when that is done.
    assert!(
        third.flush(Duration::from_secs(10)).await,
        "the writer's place was not given back"
    );
    let slack = scheduling_slack().await;
    let left = tokio::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the reader was not woken")
        .unwrap()
        .unwrap();
    woken(left, "reader after the writer gave up", slack);
    r.release().await.unwrap();
    read.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waiters_of_every_kind_are_notified() {
    waiters_of_every_kind_are_woken(&SqlDb::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_waiters_of_every_kind_are_woken() {
    waiters_of_every_kind_are_woken(&SqlDb::mariadb()).await;
}
