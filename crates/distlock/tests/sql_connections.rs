//! Connections and liveness of the PostgreSQL and MariaDB backends: a registry needs two
//! connections to the server whatever the number of keys it waits for, a release never needs a
//! connection the backend did not keep (it works when the server takes no new ones), and a
//! waiter that stops coming (paused with its connection open, or gone) keeps a released key
//! from the others for a bounded time only.

mod common {
    pub mod sql;
}

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::sql::*;
use distlock::{LockRegistry, RegistryOptions};
use distlock_testkit::mysql::MariaDbServer;
use distlock_testkit::timing::scheduling_slack;
use mysql_async::prelude::Queryable;

const KEYS: usize = 5;

/// One registry waits on [`KEYS`] keys that another holds: its connections, sampled while it
/// waits, never number more than two; all its waiters get their keys once they are released.
async fn waiting_on_several_keys_needs_two_connections(
    url: &str,
    backend: fn(&str) -> BoxBackend,
    mut sessions: Sessions,
) {
    let holder =
        LockRegistry::from_backend(backend(url).await, RegistryOptions::default()).unwrap();
    let mut guards = Vec::new();
    for i in 0..KEYS {
        guards.push(
            holder
                .obtain(&format!("k{i}"))
                .unwrap()
                .lock()
                .await
                .unwrap(),
        );
    }
    let before = sessions.ids().await;
    let waiter =
        LockRegistry::from_backend(backend(url).await, RegistryOptions::default()).unwrap();
    let tasks: Vec<_> = (0..KEYS)
        .map(|i| {
            let lock = waiter.obtain(&format!("k{i}")).unwrap();
            tokio::spawn(async move {
                let g = lock.try_lock_for(Duration::from_secs(60)).await?;
                g.release().await
            })
        })
        .collect();
    let mut most = 0;
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = sessions.ids().await;
        most = most.max(now.difference(&before).count());
    }
    assert!(
        most <= 2,
        "a registry waiting on {KEYS} keys had {most} connections (before: {before:?})"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("a waiter did not get its released key")
            .unwrap()
            .unwrap();
    }
}

/// The sessions on a test database, seen through one connection of the test's own that stays
/// open (one opened per look would itself be seen while the server closes it).
enum Sessions {
    Pg(tokio_postgres::Client, String),
    My(mysql_async::Conn, String),
}

impl Sessions {
    async fn pg(url: &str, db: &str) -> Sessions {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        Sessions::Pg(client, db.to_owned())
    }

    async fn my(url: &str, db: &str) -> Sessions {
        Sessions::My(
            mysql_async::Conn::from_url(url).await.unwrap(),
            db.to_owned(),
        )
    }

    async fn ids(&mut self) -> BTreeSet<String> {
        match self {
            Sessions::Pg(c, db) => c
                .query(
                    "SELECT pid::text FROM pg_stat_activity \
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&*db],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect(),
            Sessions::My(c, db) => c
                .exec::<u64, _, _>(
                    "SELECT id FROM information_schema.processlist \
                     WHERE db = ? AND id <> CONNECTION_ID()",
                    (db.as_str(),),
                )
                .await
                .unwrap()
                .iter()
                .map(u64::to_string)
                .collect(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waiting_on_several_keys_needs_two_connections() {
    let db = pg_db();
    let sessions = Sessions::pg(db.url(), db.name()).await;
    waiting_on_several_keys_needs_two_connections(db.url(), pg_boxed, sessions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_waiting_on_several_keys_needs_two_connections() {
    let db = my_db();
    let sessions = Sessions::my(db.url(), db.name()).await;
    waiting_on_several_keys_needs_two_connections(db.url(), my_boxed, sessions).await;
}

/// Opens connections to the server of `url` until it refuses one (`max_connections`, and the
/// one more it keeps for an administrator); they stay open while the result lives.
async fn fill_connections(url: &str) -> Vec<mysql_async::Conn> {
    let opts = mysql_async::Opts::from_url(url).unwrap();
    let mut conns = Vec::new();
    loop {
        match mysql_async::Conn::new(opts.clone()).await {
            Ok(c) => conns.push(c),
            Err(mysql_async::Error::Server(e)) if e.code == 1040 => return conns,
            Err(e) => panic!("filling the server's connections: {e}"),
        }
        assert!(
            conns.len() < 500,
            "the server takes any number of connections"
        );
    }
}

/// A holder's release works when the server takes no new connections: contended holds (whose
/// release also rings the waiters' doorbell) pass between two waiting registries that started
/// waiting after every free connection of the server was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_contended_release_needs_no_new_connection() {
    let server =
        Arc::new(MariaDbServer::start_with_args(&["--max-connections=20"]).expect("mariadb"));
    let db = server.fresh_database().unwrap();
    let url = db.url().to_owned();
    let first = registry(my(&url).await, opts(30_000));
    let guard = first.obtain("k").unwrap().lock().await.unwrap();
    let mut registries = Vec::new();
    for _ in 0..2 {
        registries.push(registry(my(&url).await, opts(30_000)));
    }
    // Every registry is connected; the server takes no more connections from here on, so
    // whatever a registry did not keep (a listener, a connection to hold doorbells on) it
    // cannot have.
    let fillers = fill_connections(&url).await;
    let waiters: Vec<_> = registries
        .into_iter()
        .map(|reg| {
            tokio::spawn(async move {
                let g = reg
                    .obtain("k")
                    .unwrap()
                    .try_lock_for(Duration::from_secs(60))
                    .await
                    .expect("the waiter got the lock");
                // Let the other waiter's attempts find the lock busy (and want it).
                tokio::time::sleep(Duration::from_millis(300)).await;
                g.release().await.map(|r| (r, reg))
            })
        })
        .collect();
    // Both wait before the first holder releases.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    guard.release().await.expect("release with the server full");
    for w in waiters {
        let released = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a waiter did not get the lock")
            .unwrap();
        assert!(
            released.is_ok(),
            "a release failed with the server full: {:?}",
            released.err()
        );
    }
    drop(fillers);
}

/// The name of a lock's turnstile on MariaDB (the backend's doorbell naming: an MD5 of the
/// length-prefixed database-qualified table, region and key).
fn turnstile(database: &str, region: &str, key: &str) -> String {
    use md5::{Digest, Md5};
    let mut h = Md5::new();
    let table = format!("{database}.distlock_locks");
    for part in [table.as_str(), region, key] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("distlockq-{hex}")
}

/// A process at the head of a lock's line that never comes (paused with its connection open,
/// as SIGSTOP leaves it; here a connection that holds the lock's turnstile) keeps a released
/// lock from the waiter behind it for at most the head's grace (1 s) and the waiter's poll
/// interval (500 ms); a head whose connection closes (killed) lets it go at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_head_waiter_that_never_comes_delays_the_next_one_boundedly() {
    let db = my_db();
    let holder = registry(my(db.url()).await, RegistryOptions::default());
    let waiter = registry(my(db.url()).await, RegistryOptions::default());
    for kill_head in [false, true] {
        let guard = holder.obtain("k").unwrap().lock().await.unwrap();
        let mut head = mysql_async::Conn::from_url(db.url()).await.unwrap();
        let name = turnstile(db.name(), "lock", "k");
        let took: Option<i64> = head
            .query_first(format!("SELECT GET_LOCK('{name}', 0)"))
            .await
            .unwrap();
        assert_eq!(took, Some(1), "the head took the turnstile");
        let lock = waiter.obtain("k").unwrap();
        let waiting = tokio::spawn(async move {
            let g = lock.try_lock_for(Duration::from_secs(30)).await.unwrap();
            let at = tokio::time::Instant::now();
            g.release().await.unwrap();
            at
        });
        // The waiter queues behind the head.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let head = if kill_head {
            head.disconnect().await.unwrap();
            None
        } else {
            Some(head)
        };
        let slack = scheduling_slack().await;
        let released = tokio::time::Instant::now();
        guard.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("the waiter never got the released lock")
            .unwrap();
        let delay = got - released;
        let bound = Duration::from_millis(1500) + slack;
        assert!(
            delay <= bound,
            "head killed: {kill_head}: the waiter got the released lock after {delay:?} (bound {bound:?})"
        );
        if let Some(head) = head {
            head.disconnect().await.unwrap();
        }
    }
}
