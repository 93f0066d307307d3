//! The wait table (`wait.rs`): a release wakes the next waiter alone, and waiters that stop
//! waiting, with or without a word, hold nobody up for more than one hand-over.

use super::*;
use crate::backend::{AcquireRequest, Backend, ReleaseSubscription};
use crate::backends::sql::tests::number;
use distlock_testkit::postgres::{PostgresServer, TestDatabase};

const LEASE: Duration = Duration::from_secs(30);
/// Long enough for a notification on the loopback to arrive, should one have been sent.
const QUIET: Duration = Duration::from_millis(300);
/// Far longer than a notification takes; the tests only wait this long when they fail.
const WOKEN: Duration = Duration::from_secs(10);

/// `n` backends (as many processes) on one fresh database.
async fn backends(n: usize) -> (TestDatabase, Vec<PostgresBackend>) {
    let server = PostgresServer::machine_or_start().expect("postgresql");
    let db = server.fresh_database().unwrap();
    let url = format!("{}?sslmode=disable", db.url());
    let mut b = Vec::new();
    for _ in 0..n {
        b.push(PostgresBackend::connect(&url).await.unwrap());
    }
    (db, b)
}

fn entries(db: &TestDatabase) -> usize {
    number(db.query("SELECT COUNT(*) FROM distlock_locks_waits"))
}

async fn attempt(b: &PostgresBackend, name: &LockName, token: Token) -> Attempt {
    let request = AcquireRequest::new(name.clone(), token, LEASE);
    b.acquire(&request).await.unwrap()
}

/// The test key, held by `b` with the token returned.
async fn held(b: &PostgresBackend) -> (LockName, Token) {
    let name = LockName::new("wait", "k").unwrap();
    let holder = Token::random();
    let got = attempt(b, &name, holder).await;
    assert!(matches!(got, Attempt::Acquired { .. }), "{got:?}");
    (name, holder)
}

/// Finds the key busy and subscribes, as a waiting registry does.
async fn wait(b: &PostgresBackend, name: &LockName) -> (Token, ReleaseSubscription) {
    let token = Token::random();
    let busy = attempt(b, name, token).await;
    assert!(matches!(busy, Attempt::Busy { .. }), "{busy:?}");
    (token, b.subscribe(name, token).await.unwrap())
}

async fn fires(sub: &mut ReleaseSubscription, within: Duration) -> bool {
    tokio::time::timeout(within, sub.released()).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_next_waiter_alone() {
    let (db, b) = backends(4).await;
    let name = LockName::new("wait", "k").unwrap();
    let mut holder = (0, Token::random());
    let first = attempt(&b[0], &name, holder.1).await;
    assert!(matches!(first, Attempt::Acquired { .. }), "{first:?}");
    let mut waiters = Vec::new();
    for x in &b[1..] {
        waiters.push(wait(x, &name).await);
    }
    assert_eq!(entries(&db), 3);
    for i in 0..3 {
        let released = b[holder.0].release(&name, holder.1).await.unwrap();
        assert!(released.was_held && released.contended, "{released:?}");
        assert!(
            fires(&mut waiters[i].1, WOKEN).await,
            "waiter {i} not woken"
        );
        for (j, later) in waiters.iter_mut().enumerate().skip(i + 1) {
            assert!(
                !fires(&mut later.1, QUIET).await,
                "waiter {j} woken by the release that named waiter {i}"
            );
        }
        let token = waiters[i].0;
        let got = attempt(&b[i + 1], &name, token).await;
        assert!(matches!(got, Attempt::Acquired { .. }), "{got:?}");
        holder = (i + 1, token);
        assert_eq!(
            entries(&db),
            2 - i,
            "the woken waiter's entry went with the release"
        );
    }
    drop(waiters);
    assert!(b[holder.0].release(&name, holder.1).await.unwrap().was_held);
    assert_eq!(entries(&db), 0);
}

/// A waiter that acquires by its poll (not woken by its entry) gives its entry back before it
/// holds the key, so its own release cannot name it, nor a later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_acquires_otherwise_leaves_no_entry() {
    let (db, b) = backends(2).await;
    let (name, _) = held(&b[0]).await;
    let (token, _sub) = wait(&b[1], &name).await;
    assert_eq!(entries(&db), 1);
    b[0].force_release(&name).await.unwrap();
    let got = attempt(&b[1], &name, token).await;
    assert!(matches!(got, Attempt::Acquired { .. }), "{got:?}");
    assert_eq!(entries(&db), 0);
}

/// A waiter that gives up leaves its entry with its subscription; one that vanished without a
/// word costs the next release its wake-up, once (the others' polls find the key free), and its
/// entry goes with that release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_gone_hold_up_one_hand_over_at_most() {
    let (db, b) = backends(4).await;
    let (name, holder) = held(&b[0]).await;
    let (_, gave_up) = wait(&b[1], &name).await;
    let (_, vanished) = wait(&b[2], &name).await;
    let (token, mut last) = wait(&b[3], &name).await;
    assert_eq!(entries(&db), 3);
    drop(gave_up);
    let deadline = std::time::Instant::now() + WOKEN;
    while entries(&db) != 2 {
        assert!(std::time::Instant::now() < deadline, "the entry stayed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // As a process that died: nothing gives its entry back.
    std::mem::forget(vanished);
    assert!(b[0].release(&name, holder).await.unwrap().was_held);
    assert!(!fires(&mut last, QUIET).await, "woken, though not next");
    assert_eq!(
        entries(&db),
        1,
        "the vanished waiter's entry went with the release"
    );
    // Its poll finds the key free; the next release wakes nobody (nobody waits).
    let got = attempt(&b[3], &name, token).await;
    assert!(matches!(got, Attempt::Acquired { .. }), "{got:?}");
    assert_eq!(entries(&db), 0);
    // A waiter again, with the key held by the last one: woken at its release.
    let (_, mut again) = wait(&b[1], &name).await;
    assert!(b[3].release(&name, token).await.unwrap().contended);
    assert!(fires(&mut again, WOKEN).await);
}

/// A release that finds no entry rings the table's channel; a waiter whose subscription came
/// just after it (as a registry on its way back from its own release) heard nothing, and first
/// in line it is woken by its look at the free key, not left to its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_missed_the_release_is_woken_when_first_in_line() {
    let (db, b) = backends(2).await;
    let (name, holder) = held(&b[0]).await;
    let token = Token::random();
    let busy = attempt(&b[1], &name, token).await;
    assert!(matches!(busy, Attempt::Busy { .. }), "{busy:?}");
    assert!(b[0].release(&name, holder).await.unwrap().contended);
    let mut late = b[1].subscribe(&name, token).await.unwrap();
    assert_eq!(entries(&db), 1);
    assert!(fires(&mut late, WOKEN).await, "left to its poll");
    let got = attempt(&b[1], &name, token).await;
    assert!(matches!(got, Attempt::Acquired { .. }), "{got:?}");
    // First in line with the key held, nothing wakes it.
    let (_, mut next) = wait(&b[0], &name).await;
    assert!(
        !fires(&mut next, QUIET).await,
        "woken while the key is held"
    );
}
