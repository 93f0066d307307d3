//! Unit tests of the SQLite backend on temporary files.

use super::open::MAX_TABLE_LEN;
use super::*;
use crate::backends::sql::tests::count_holds;

const LEASE: Duration = Duration::from_secs(30);

fn name(key: &str) -> LockName {
    LockName::new("lock", key).expect("valid key")
}

fn temp_backend() -> (tempfile::TempDir, SqliteBackend) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let backend = SqliteBackend::open(dir.path().join("locks.db")).expect("open");
    (dir, backend)
}

fn fence_of(attempt: Attempt) -> u64 {
    match attempt {
        Attempt::Acquired { fence } | Attempt::HandedOver { fence } => fence,
        Attempt::Busy { .. } => panic!("expected Acquired, got {attempt:?}"),
    }
}

#[tokio::test]
async fn acquire_busy_release() {
    let (_dir, b) = temp_backend();
    let n = name("voucher:42");
    let (t1, t2) = (Token::random(), Token::random());

    assert_eq!(
        b.acquire(&AcquireRequest::new(n.clone(), t1, LEASE))
            .await
            .unwrap(),
        Attempt::Acquired { fence: 1 }
    );
    match b
        .acquire(&AcquireRequest::new(n.clone(), t2, LEASE))
        .await
        .unwrap()
    {
        Attempt::Busy {
            retry_after: Some(d),
            ..
        } => {
            assert!(
                d > Duration::from_secs(25) && d <= LEASE,
                "retry_after {d:?}"
            )
        }
        other => panic!("expected Busy with a retry time, got {other:?}"),
    }
    let info = b.inspect(&n).await.unwrap().expect("held");
    assert_eq!(info.fence, Some(1));
    assert!(info.remaining.unwrap() <= LEASE);

    // Nobody releases a lock they do not hold.
    assert_eq!(
        b.release(&n, t2).await.unwrap(),
        Released {
            was_held: false,
            contended: false
        }
    );
    assert!(b.inspect(&n).await.unwrap().is_some());

    assert_eq!(
        b.release(&n, t1).await.unwrap(),
        Released {
            was_held: true,
            contended: false
        }
    );
    assert_eq!(b.inspect(&n).await.unwrap(), None);
    assert!(
        !b.release(&n, t1).await.unwrap().was_held,
        "a second release finds nothing"
    );

    assert_eq!(
        b.acquire(&AcquireRequest::new(n.clone(), t2, LEASE))
            .await
            .unwrap(),
        Attempt::Acquired { fence: 2 }
    );
}

#[tokio::test]
async fn fence_increases_per_key_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/locks.db");
    let b = SqliteBackend::open(&path).unwrap();
    let (a, other) = (name("a"), name("b"));
    let mut last = 0;
    for _ in 0..5 {
        let t = Token::random();
        let fence = fence_of(
            b.acquire(&AcquireRequest::new(a.clone(), t, LEASE))
                .await
                .unwrap(),
        );
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
        assert!(b.release(&a, t).await.unwrap().was_held);
    }
    assert_eq!(last, 5);
    // Each key has its own counter, and the same key in another region is another lock.
    assert_eq!(
        fence_of(
            b.acquire(&AcquireRequest::new(other.clone(), Token::random(), LEASE))
                .await
                .unwrap()
        ),
        1
    );
    let elsewhere = LockName::new("other-prefix", "a").unwrap();
    assert_eq!(
        fence_of(
            b.acquire(&AcquireRequest::new(
                elsewhere.clone(),
                Token::random(),
                LEASE
            ))
            .await
            .unwrap()
        ),
        1
    );
    drop(b);

    let reopened = SqliteBackend::open(&path).unwrap();
    assert_eq!(
        fence_of(
            reopened
                .acquire(&AcquireRequest::new(a.clone(), Token::random(), LEASE))
                .await
                .unwrap()
        ),
        6
    );
}

#[tokio::test]
async fn expired_lease_is_taken_over() {
    let (_dir, b) = temp_backend();
    let n = name("short");
    let (old, new) = (Token::random(), Token::random());
    // Long enough that a busy machine still sees it held right after taking it.
    let short = Duration::from_millis(1000);

    assert_eq!(
        fence_of(
            b.acquire(&AcquireRequest::new(n.clone(), old, short))
                .await
                .unwrap()
        ),
        1
    );
    assert!(matches!(
        b.acquire(&AcquireRequest::new(n.clone(), new, LEASE))
            .await
            .unwrap(),
        Attempt::Busy { .. }
    ));
    tokio::time::sleep(Duration::from_millis(1150)).await;

    assert_eq!(
        b.inspect(&n).await.unwrap(),
        None,
        "an expired lease is not held"
    );
    assert_eq!(
        fence_of(
            b.acquire(&AcquireRequest::new(n.clone(), new, LEASE))
                .await
                .unwrap()
        ),
        2
    );
    // The stale holder can neither extend nor release the new holder's lock.
    assert!(!b.extend(&n, old, LEASE).await.unwrap());
    assert!(!b.release(&n, old).await.unwrap().was_held);
    assert_eq!(b.inspect(&n).await.unwrap().and_then(|i| i.fence), Some(2));
}

#[tokio::test]
async fn expired_holder_cannot_extend_or_release() {
    let (_dir, b) = temp_backend();
    let n = name("lapsed");
    let t = Token::random();
    b.acquire(&AcquireRequest::new(
        n.clone(),
        t,
        Duration::from_millis(200),
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(!b.extend(&n, t, LEASE).await.unwrap());
    assert!(!b.release(&n, t).await.unwrap().was_held);
}

#[tokio::test]
async fn extend_is_owner_checked() {
    let (_dir, b) = temp_backend();
    let n = name("renewed");
    let t = Token::random();
    b.acquire(&AcquireRequest::new(
        n.clone(),
        t,
        Duration::from_millis(500),
    ))
    .await
    .unwrap();

    assert!(
        !b.extend(&n, Token::random(), LEASE).await.unwrap(),
        "wrong token"
    );
    assert!(
        !b.extend(&name("never-taken"), t, LEASE).await.unwrap(),
        "no such lock"
    );
    assert!(b.extend(&n, t, LEASE).await.unwrap());
    let remaining = b
        .inspect(&n)
        .await
        .unwrap()
        .and_then(|i| i.remaining)
        .unwrap();
    assert!(
        remaining > Duration::from_secs(25),
        "extended lease {remaining:?}"
    );

    // Still held after the original 500 ms lease would have ended.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(matches!(
        b.acquire(&AcquireRequest::new(n.clone(), Token::random(), LEASE))
            .await
            .unwrap(),
        Attempt::Busy { .. }
    ));
}

#[tokio::test]
async fn extend_many_reports_each_entry() {
    let (_dir, b) = temp_backend();
    let (x, y) = (name("x"), name("y"));
    let (tx, ty) = (Token::random(), Token::random());
    b.acquire(&AcquireRequest::new(
        x.clone(),
        tx,
        Duration::from_millis(500),
    ))
    .await
    .unwrap();
    b.acquire(&AcquireRequest::new(
        y.clone(),
        ty,
        Duration::from_millis(500),
    ))
    .await
    .unwrap();
    let batch = vec![
        Renewal {
            name: x.clone(),
            token: tx,
            lease: LEASE,
        },
        Renewal {
            name: y.clone(),
            token: Token::random(),
            lease: LEASE,
        },
        Renewal {
            name: name("z"),
            token: tx,
            lease: LEASE,
        },
    ];
    let results: Vec<bool> = b
        .extend_many(&batch)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(results, vec![true, false, false]);
    assert!(b.extend_many(&[]).await.is_empty());

    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(b.inspect(&x).await.unwrap().is_some(), "x was extended");
    assert!(b.inspect(&y).await.unwrap().is_none(), "y was not");
}

#[tokio::test]
async fn two_backends_on_one_file_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a = SqliteBackend::open(&path).unwrap();
    let b = SqliteBackend::open(&path).unwrap();
    let n = name("shared");
    let (ta, tb) = (Token::random(), Token::random());

    assert_eq!(
        fence_of(
            a.acquire(&AcquireRequest::new(n.clone(), ta, LEASE))
                .await
                .unwrap()
        ),
        1
    );
    assert!(matches!(
        b.acquire(&AcquireRequest::new(n.clone(), tb, LEASE))
            .await
            .unwrap(),
        Attempt::Busy { .. }
    ));
    assert!(
        !b.release(&n, ta.as_u128().wrapping_add(1).into())
            .await
            .unwrap()
            .was_held
    );
    assert_eq!(b.inspect(&n).await.unwrap().and_then(|i| i.fence), Some(1));
    assert!(a.release(&n, ta).await.unwrap().was_held);
    assert_eq!(
        fence_of(
            b.acquire(&AcquireRequest::new(n.clone(), tb, LEASE))
                .await
                .unwrap()
        ),
        2
    );
    assert!(matches!(
        a.acquire(&AcquireRequest::new(n.clone(), ta, LEASE))
            .await
            .unwrap(),
        Attempt::Busy { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_connections_admit_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let backends: Vec<SqliteBackend> = (0..4)
        .map(|_| SqliteBackend::open(&path).unwrap())
        .collect();
    for round in 0..5 {
        let n = name(&format!("race-{round}"));
        let tasks: Vec<_> = backends
            .iter()
            .flat_map(|b| std::iter::repeat_n(b.clone(), 3))
            .map(|b| {
                let n = n.clone();
                tokio::spawn(async move {
                    b.acquire(&AcquireRequest::new(n.clone(), Token::random(), LEASE))
                        .await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            if let Attempt::Acquired { fence } = task.await.unwrap().unwrap() {
                assert_eq!(fence, 1);
                winners += 1;
            }
        }
        assert_eq!(winners, 1, "round {round}");
    }
}

#[tokio::test]
async fn release_wakes_subscribers_of_this_process() {
    let (_dir, b) = temp_backend();
    let n = name("notify");
    let t = Token::random();
    b.acquire(&AcquireRequest::new(n.clone(), t, LEASE))
        .await
        .unwrap();
    let mut sub = b.subscribe(&n, Token::random()).await.unwrap();
    let mut other = b
        .subscribe(&name("unrelated"), Token::random())
        .await
        .unwrap();
    assert!(b.release(&n, t).await.unwrap().was_held);
    tokio::time::timeout(Duration::from_secs(1), sub.released())
        .await
        .expect("the release fired the subscription");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), other.released())
            .await
            .is_err(),
        "another key's subscription stays quiet"
    );
    assert!(!b.capabilities().notifies_release);
    assert!(b.capabilities().cross_process);
}

#[tokio::test]
async fn force_release_frees_and_keeps_fence() {
    let (_dir, b) = temp_backend();
    let n = name("forced");
    let t = Token::random();
    b.acquire(&AcquireRequest::new(n.clone(), t, LEASE))
        .await
        .unwrap();
    assert!(b.force_release(&n).await.unwrap());
    assert!(!b.force_release(&n).await.unwrap());
    assert!(
        !b.extend(&n, t, LEASE).await.unwrap(),
        "the holder has lost it"
    );
    assert_eq!(
        fence_of(
            b.acquire(&AcquireRequest::new(n.clone(), Token::random(), LEASE))
                .await
                .unwrap()
        ),
        2
    );
}

#[tokio::test]
async fn dropped_acquire_gives_the_lock_back() {
    let (_dir, b) = temp_backend();
    // The orphaned attempt runs as its own task, so a later attempt may reach the connection
    // first (fence 1; the orphan then finds the lock busy). Such a round shows nothing and is
    // repeated on a fresh key; a round where the orphan won must see it give the lock back.
    for round in 0..20 {
        let n = name(&format!("cancelled-{round}"));
        // Polled once (which starts the attempt's task), then dropped.
        let first = Token::random();
        let cancelled = tokio::time::timeout(
            Duration::ZERO,
            b.acquire(&AcquireRequest::new(n.clone(), first, LEASE)),
        )
        .await;
        // An attempt whose blocking task finished before that first poll returned was not
        // cancelled: the round shows nothing.
        if let Ok(done) = cancelled {
            if let Attempt::Acquired { .. } = done.unwrap() {
                b.release(&n, first).await.unwrap();
            }
            continue;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let (token, fence) = loop {
            let token = Token::random();
            match b
                .acquire(&AcquireRequest::new(n.clone(), token, LEASE))
                .await
                .unwrap()
            {
                Attempt::Acquired { fence } | Attempt::HandedOver { fence } => {
                    break (token, fence)
                }
                Attempt::Busy { .. } => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "the cancelled attempt kept the lock"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        if fence == 2 {
            return; // the orphan acquired (fence 1) and gave the lock back
        }
        assert_eq!(fence, 1, "only the orphan can have taken a fence before");
        // Let the orphan run to its end; it must find the lock held and leave it so.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(b.extend(&n, token, LEASE).await.unwrap(), "still ours");
        b.release(&n, token).await.unwrap();
    }
    panic!("in 20 rounds the cancelled attempt never reached the database first");
}

#[tokio::test]
async fn url_with_table_opens_that_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("url.db");
    let url = format!("sqlite://{}?table=my_locks", path.display());
    let b = SqliteBackend::from_url(&url).unwrap();
    assert_eq!(b.table(), "my_locks");
    assert_eq!(b.path(), path.as_path());
    b.acquire(&AcquireRequest::new(name("k"), Token::random(), LEASE))
        .await
        .unwrap();

    let conn = Connection::open(&path).unwrap();
    let (region, key, token, fence): (String, String, Option<String>, i64) = conn
        .query_row(
            "SELECT region, lock_key, token, fence FROM my_locks",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!((region.as_str(), key.as_str(), fence), ("lock", "k", 1));
    assert!(token.is_some_and(|t| t.len() == 32 && Token::from_hex(&t).is_some()));
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert!(format!("{b:?}").contains("my_locks"));
}

#[test]
fn url_percent_escapes_are_decoded() {
    let (path, options) = parse_url("SQLite:///tmp/my%20locks.db?table=t_1").unwrap();
    assert_eq!(path, PathBuf::from("/tmp/my locks.db"));
    assert_eq!(options.table, "t_1");
    let (_, options) = parse_url("sqlite:///tmp/x.db").unwrap();
    assert_eq!(options.table, DEFAULT_TABLE);
}

#[test]
fn bad_urls_are_invalid_config_naming_the_part() {
    let cases = [
        ("redis:///tmp/x.db", "scheme"),
        ("nothing", "scheme"),
        ("sqlite:relative.db", "absolute"),
        ("sqlite://relative/x.db", "absolute"),
        ("sqlite://", "missing"),
        ("sqlite://?table=x", "missing"),
        ("sqlite:///tmp/dir/", "directory"),
        ("sqlite:///tmp/x%zz.db", "percent"),
        ("sqlite:///tmp/x.db#frag", "fragment"),
        ("sqlite:///tmp/x.db?table=bad-name", "table"),
        ("sqlite:///tmp/x.db?table=", "table"),
        ("sqlite:///tmp/x.db?table=1abc", "table"),
        ("sqlite:///tmp/x.db?table=sqlite_master", "reserves"),
        ("sqlite:///tmp/x.db?table=a&table=b", "repeated"),
        ("sqlite:///tmp/x.db?mode=ro", "unknown query parameter"),
    ];
    for (url, part) in cases {
        match SqliteBackend::from_url(url) {
            Err(Error::InvalidConfig(message)) => {
                assert!(
                    message.contains(part),
                    "{url}: {message:?} should mention {part:?}"
                )
            }
            other => panic!("{url}: expected InvalidConfig, got {other:?}"),
        }
    }
}

#[test]
fn bad_options_are_invalid_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.db");
    let bad = [
        SqliteOptions::default().table("drop table; --"),
        SqliteOptions::default().table("x".repeat(MAX_TABLE_LEN + 1)),
        SqliteOptions::default().busy_timeout(Duration::from_secs(u64::MAX)),
    ];
    for options in bad {
        let result = SqliteBackend::open_with(&file, options.clone());
        assert!(
            matches!(result, Err(Error::InvalidConfig(_))),
            "{options:?}: {result:?}"
        );
    }
    assert!(matches!(
        SqliteBackend::open(""),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        SqliteBackend::open(dir.path()),
        Err(Error::InvalidConfig(_))
    ));
    assert!(!file.exists(), "nothing is created for rejected options");
}

#[test]
fn lease_rounds_up_and_is_capped() {
    assert_eq!(lease_ms(Duration::from_micros(1)), 1);
    assert_eq!(lease_ms(Duration::from_millis(200)), 200);
    assert_eq!(lease_ms(Duration::MAX), MAX_LEASE_MS);
}

/// Counts the rows of the holds table (`places`: the waiting writers' only).
fn holds_of(path: std::path::PathBuf) -> impl Fn(bool) -> usize + Sync {
    move |places| {
        let c = Connection::open(&path).unwrap();
        c.query_row(&count_holds(places), [], |r| r.get::<_, i64>(0))
            .unwrap() as usize
    }
}

#[tokio::test]
async fn a_crashed_share_ends_with_its_lease() {
    let (_dir, b) = temp_backend();
    let count = holds_of(b.path().to_owned());
    crate::backends::sql::kinds::checks::a_crashed_share_ends_with_its_lease(&b, &count).await;
}

#[tokio::test]
async fn a_lone_reader_is_joined_and_leaves_first() {
    let (_dir, b) = temp_backend();
    let count = holds_of(b.path().to_owned());
    crate::backends::sql::kinds::checks::a_lone_reader_is_joined_and_leaves_first(
        &b, &count, false,
    )
    .await;
}

#[tokio::test]
async fn permits_must_agree() {
    let (_dir, b) = temp_backend();
    crate::backends::sql::kinds::checks::permits_must_agree(&b).await;
}

#[tokio::test]
async fn a_waiting_writer_keeps_readers_out() {
    let (_dir, b) = temp_backend();
    let count = holds_of(b.path().to_owned());
    crate::backends::sql::kinds::checks::a_waiting_writer_keeps_readers_out(&b, &count).await;
}

/// A file whose table an older distlock made (no `owner` column) gets the column when it is
/// opened; its holds show "unknown", new ones their owner.
#[tokio::test]
async fn an_older_table_is_upgraded_and_its_holds_show_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE distlock_locks (region TEXT NOT NULL, lock_key TEXT NOT NULL,
                 token TEXT NULL, fence INTEGER NOT NULL, created_ms INTEGER NOT NULL,
                 expires_ms INTEGER NOT NULL, PRIMARY KEY (region, lock_key));
             INSERT INTO distlock_locks VALUES ('lock', 'old', 'feedc0de', 1, 0,
                 CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 60000)",
        )
        .unwrap();
    }
    let b = SqliteBackend::open(&path).unwrap();
    let info = b.inspect(&name("old")).await.unwrap().unwrap();
    assert_eq!(info.owners, [crate::backend::UNKNOWN_OWNER]);
    let owner = crate::Owner::new("lite:7").unwrap();
    let request = AcquireRequest::new(name("new"), Token::random(), LEASE).with_owner(owner);
    fence_of(b.acquire(&request).await.unwrap());
    let info = b.inspect(&name("new")).await.unwrap().unwrap();
    assert_eq!(info.owners, ["lite:7"]);
}
