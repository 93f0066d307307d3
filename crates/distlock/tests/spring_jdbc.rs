//! Spring compatibility of the SQL backends: distlock with `spring=true` and a client that
//! issues exactly the SQL of Spring Integration's `DefaultLockRepository` (as of Spring
//! Integration 7.0: `UPDATE` then `INSERT` in a READ COMMITTED transaction to acquire, `DELETE`
//! to release, `UPDATE … SET EXPIRED_AFTER` to renew, `SELECT COUNT(REGION)` for `isAcquired`;
//! times from the client's clock in UTC, `LOCK_KEY` = `UUIDConverter.getUUID(key)`) share the
//! `INT_LOCK` table and exclude each other both ways, on PostgreSQL and on MariaDB.

mod common {
    pub mod jdbc;
    pub mod sql;
}

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::jdbc::{my_time, pg_sql, Db};
use common::sql::{my_boxed, my_db, pg_boxed, pg_db, BoxBackend};
use distlock::backends::mysql::MySqlBackend;
use distlock::backends::postgres::PostgresBackend;
use distlock::{Error, LockRegistry, Owner, RegistryOptions};
use mysql_async::prelude::Queryable;

// DefaultLockRepository's statements with the default prefix INT_, verbatim.
const DELETE: &str = "DELETE FROM INT_LOCK WHERE REGION=? AND LOCK_KEY=? AND CLIENT_ID=?";
const UPDATE: &str = "UPDATE INT_LOCK SET CLIENT_ID=?, EXPIRED_AFTER=? \
                      WHERE REGION=? AND LOCK_KEY=? AND (CLIENT_ID=? OR EXPIRED_AFTER<?)";
const INSERT: &str =
    "INSERT INTO INT_LOCK (REGION, LOCK_KEY, CLIENT_ID, CREATED_DATE, EXPIRED_AFTER) \
                      VALUES (?, ?, ?, ?, ?)";
const COUNT: &str = "SELECT COUNT(REGION) FROM INT_LOCK \
                     WHERE REGION=? AND LOCK_KEY=? AND CLIENT_ID=? AND EXPIRED_AFTER>=?";
const RENEW: &str =
    "UPDATE INT_LOCK SET EXPIRED_AFTER=? WHERE REGION=? AND LOCK_KEY=? AND CLIENT_ID=?";

// Spring's schema-postgresql.sql and schema-mysql.sql for INT_LOCK.
const PG_SCHEMA: &str = "CREATE TABLE INT_LOCK  (
	LOCK_KEY CHAR(36) NOT NULL,
	REGION VARCHAR(100) NOT NULL,
	CLIENT_ID CHAR(36),
	CREATED_DATE TIMESTAMP NOT NULL,
	EXPIRED_AFTER TIMESTAMP NOT NULL,
	constraint INT_LOCK_PK primary key (LOCK_KEY, REGION)
)";
const MYSQL_SCHEMA: &str = "CREATE TABLE INT_LOCK  (
	LOCK_KEY CHAR(36) NOT NULL,
	REGION VARCHAR(100) NOT NULL,
	CLIENT_ID CHAR(36),
	CREATED_DATE DATETIME(6) NOT NULL,
	EXPIRED_AFTER DATETIME(6) NOT NULL,
	constraint INT_LOCK_PK primary key (LOCK_KEY, REGION)
) ENGINE=InnoDB";

const REGION: &str = "DEFAULT";

/// `UUIDConverter.getUUID(key)` for a key that is not itself a UUID:
/// `UUID.nameUUIDFromBytes(key.getBytes(UTF_8))`, computed here independently of distlock.
fn spring_uuid(key: &str) -> String {
    use md5::{Digest, Md5};
    uuid_text(Md5::digest(key.as_bytes()).into(), 3)
}

/// `b` as a UUID of `version` (RFC 4122 variant) in its `8-4-4-4-12` hex form.
fn uuid_text(mut b: [u8; 16], version: u8) -> String {
    b[6] = (b[6] & 0x0f) | (version << 4);
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let (a, rest) = h.split_at(8);
    let (b, rest) = rest.split_at(4);
    let (c, rest) = rest.split_at(4);
    let (d, e) = rest.split_at(4);
    format!("{a}-{b}-{c}-{d}-{e}")
}

/// One Spring `DefaultLockRepository`: a client id (random UUID) and a time to live.
struct Spring {
    db: Db,
    id: String,
    ttl: Duration,
}

impl Spring {
    async fn pg(url: &str, ttl: Duration) -> Spring {
        Spring {
            db: Db::pg(url).await,
            id: uuid_v4(),
            ttl,
        }
    }

    async fn my(url: &str, ttl: Duration) -> Spring {
        Spring {
            db: Db::my(url),
            id: uuid_v4(),
            ttl,
        }
    }

    /// `DefaultLockRepository.acquire(lock, ttl)`.
    async fn acquire(&self, key: &str) -> bool {
        let lock = spring_uuid(key);
        let now = SystemTime::now();
        let until = now + self.ttl;
        match &self.db {
            Db::Pg(c) => {
                c.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                    .await
                    .unwrap();
                let n = c
                    .execute(
                        &pg_sql(UPDATE),
                        &[&self.id, &until, &REGION, &lock, &self.id, &now],
                    )
                    .await
                    .unwrap();
                if n > 0 {
                    c.batch_execute("COMMIT").await.unwrap();
                    return true;
                }
                let now = SystemTime::now();
                let until = now + self.ttl;
                match c
                    .execute(&pg_sql(INSERT), &[&REGION, &lock, &self.id, &now, &until])
                    .await
                {
                    Ok(n) => {
                        c.batch_execute("COMMIT").await.unwrap();
                        n > 0
                    }
                    Err(e) => {
                        // DataIntegrityViolationException: the row exists, not acquired.
                        assert_eq!(
                            e.code(),
                            Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
                            "{e}"
                        );
                        c.batch_execute("ROLLBACK").await.unwrap();
                        false
                    }
                }
            }
            Db::My(pool) => {
                let mut conn = pool.get_conn().await.unwrap();
                let mut tx_opts = mysql_async::TxOpts::default();
                tx_opts.with_isolation_level(mysql_async::IsolationLevel::ReadCommitted);
                let mut tx = conn.start_transaction(tx_opts).await.unwrap();
                tx.exec_drop(
                    UPDATE,
                    (
                        &self.id,
                        my_time(until),
                        REGION,
                        &lock,
                        &self.id,
                        my_time(now),
                    ),
                )
                .await
                .unwrap();
                if tx.affected_rows() > 0 {
                    tx.commit().await.unwrap();
                    return true;
                }
                let now = SystemTime::now();
                let until = now + self.ttl;
                match tx
                    .exec_drop(
                        INSERT,
                        (REGION, &lock, &self.id, my_time(now), my_time(until)),
                    )
                    .await
                {
                    Ok(()) => {
                        let n = tx.affected_rows();
                        tx.commit().await.unwrap();
                        n > 0
                    }
                    // A duplicate key: another client inserted the row first. A deadlock
                    // (1213) between two INSERTs of the same new row is what InnoDB answers
                    // when both wait on the row's gap lock; Spring's `JdbcLock` treats it as
                    // a transient failure (`DeadlockLoserDataAccessException`) and tries again.
                    Err(mysql_async::Error::Server(e)) => {
                        assert!(
                            e.code == 1062 || e.code == 1213,
                            "duplicate key or deadlock: {} {}",
                            e.code,
                            e.message
                        );
                        tx.rollback().await.ok();
                        false
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }

    /// `DefaultLockRepository.delete(lock)`.
    async fn delete(&self, key: &str) -> bool {
        let lock = spring_uuid(key);
        match &self.db {
            Db::Pg(c) => {
                c.execute(&pg_sql(DELETE), &[&REGION, &lock, &self.id])
                    .await
                    .unwrap()
                    == 1
            }
            Db::My(pool) => {
                let mut conn = pool.get_conn().await.unwrap();
                conn.exec_drop(DELETE, (REGION, &lock, &self.id))
                    .await
                    .unwrap();
                conn.affected_rows() == 1
            }
        }
    }

    /// `DefaultLockRepository.renew(lock, ttl)`.
    async fn renew(&self, key: &str) -> bool {
        let lock = spring_uuid(key);
        let until = SystemTime::now() + self.ttl;
        match &self.db {
            Db::Pg(c) => {
                c.execute(&pg_sql(RENEW), &[&until, &REGION, &lock, &self.id])
                    .await
                    .unwrap()
                    == 1
            }
            Db::My(pool) => {
                let mut conn = pool.get_conn().await.unwrap();
                conn.exec_drop(RENEW, (my_time(until), REGION, &lock, &self.id))
                    .await
                    .unwrap();
                conn.affected_rows() == 1
            }
        }
    }

    /// `DefaultLockRepository.isAcquired(lock)`.
    async fn is_acquired(&self, key: &str) -> bool {
        let lock = spring_uuid(key);
        let now = SystemTime::now();
        match &self.db {
            Db::Pg(c) => {
                let n: i64 = c
                    .query_one(&pg_sql(COUNT), &[&REGION, &lock, &self.id, &now])
                    .await
                    .unwrap()
                    .get(0);
                n == 1
            }
            Db::My(pool) => {
                let mut conn = pool.get_conn().await.unwrap();
                let n: Option<i64> = conn
                    .exec_first(COUNT, (REGION, &lock, &self.id, my_time(now)))
                    .await
                    .unwrap();
                n == Some(1)
            }
        }
    }
}

fn uuid_v4() -> String {
    uuid_text(rand::random::<u128>().to_be_bytes(), 4)
}

async fn exclusion_both_ways(
    backend: impl Fn() -> BoxBackend,
    spring: impl Fn(Duration) -> BoxSpring,
) {
    let opts = || {
        RegistryOptions::default()
            .with_lease(Duration::from_secs(10))
            .with_owner(Owner::new("billing-7:42").unwrap())
    };
    let ours = LockRegistry::from_backend(backend().await, opts()).unwrap();
    let java = spring(Duration::from_secs(10)).await;
    let key = "orders:42";

    // distlock holds: Spring cannot acquire.
    let guard = ours.obtain(key).unwrap().lock().await.unwrap();
    let info = ours.obtain(key).unwrap().inspect().await.unwrap().unwrap();
    assert_eq!(info.owners, ["billing-7:42"], "distlock's own description");
    assert!(
        !java.acquire(key).await,
        "Spring acquired a lock distlock holds"
    );
    assert!(!java.is_acquired(key).await);
    assert!(
        !java.renew(key).await,
        "Spring renewed a lock it does not hold"
    );
    assert!(
        !java.delete(key).await,
        "Spring deleted a lock it does not hold"
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();

    // Spring holds: distlock cannot acquire, and sees it held.
    assert!(java.acquire(key).await);
    assert!(java.is_acquired(key).await);
    let lock = ours.obtain(key).unwrap();
    assert!(matches!(
        lock.try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
    let info = lock.inspect().await.unwrap().expect("held by Spring");
    assert!(info.remaining.unwrap() > Duration::from_secs(5));
    // Spring records no description: its holder is shown by its CLIENT_ID.
    assert_eq!(info.owners, [java.id.as_str()], "Spring's holder");
    let listed = ours.backend().list(REGION).await.unwrap();
    let mine = listed
        .iter()
        .find(|l| l.key == spring_uuid(key) || l.key == key);
    assert_eq!(mine.expect("listed").info.owners, [java.id.as_str()]);
    assert!(
        java.acquire(key).await,
        "Spring's reentrant acquire by the same client id"
    );
    assert!(java.renew(key).await);
    assert!(java.delete(key).await);
    let guard = lock.try_lock().await.expect("free after Spring's delete");
    guard.release().await.unwrap();

    // A Spring lock that expires is taken over, and its old owner can no longer renew it.
    let short = spring(Duration::from_millis(300)).await;
    assert!(short.acquire(key).await);
    let guard = tokio::time::timeout(
        Duration::from_secs(5),
        lock.try_lock_for(Duration::from_secs(4)),
    )
    .await
    .unwrap()
    .expect("taken over after Spring's lease expired");
    assert!(!short.is_acquired(key).await);
    assert!(!short.renew(key).await);
    assert!(!short.acquire(key).await);
    // distlock renews on its own clock: its row outlives Spring's view of the old lease.
    guard.release().await.unwrap();

    // Contention: two distlock registries and two Spring clients increment one counter.
    let inside = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let (spring_cycles, our_cycles) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let reg = LockRegistry::from_backend(backend().await, opts()).unwrap();
        let (inside, counter, cycles) = (inside.clone(), counter.clone(), our_cycles.clone());
        tasks.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < until {
                let Ok(g) = reg
                    .obtain(key)
                    .unwrap()
                    .try_lock_for(Duration::from_millis(200))
                    .await
                else {
                    continue;
                };
                critical_section(&inside, &counter, &cycles).await;
                g.release().await.unwrap();
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }));
    }
    for _ in 0..2 {
        let java = spring(Duration::from_secs(10)).await;
        let (inside, counter, cycles) = (inside.clone(), counter.clone(), spring_cycles.clone());
        tasks.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < until {
                if !java.acquire(key).await {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                critical_section(&inside, &counter, &cycles).await;
                assert!(java.delete(key).await);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (s, o) = (
        spring_cycles.load(Ordering::SeqCst),
        our_cycles.load(Ordering::SeqCst),
    );
    assert_eq!(counter.load(Ordering::SeqCst), s + o, "lost updates");
    assert!(
        s > 0 && o > 0,
        "both sides got the lock: spring {s}, distlock {o}"
    );
}

type BoxSpring = std::pin::Pin<Box<dyn std::future::Future<Output = Spring> + Send>>;

impl Spring {
    fn pg_boxed(url: String, ttl: Duration) -> BoxSpring {
        Box::pin(async move { Spring::pg(&url, ttl).await })
    }

    fn my_boxed(url: String, ttl: Duration) -> BoxSpring {
        Box::pin(async move { Spring::my(&url, ttl).await })
    }
}

/// [`exclusion_both_ways`] on the database at `db_url`: distlock with `spring=true` (connected
/// by `backend`) against the Spring client `spring` makes. Returns distlock's URL.
async fn exclusion_on(
    db_url: &str,
    backend: fn(&str) -> BoxBackend,
    spring: fn(String, Duration) -> BoxSpring,
) -> String {
    let url = format!("{db_url}?spring=true&region={REGION}");
    let plain = db_url.to_owned();
    exclusion_both_ways(|| backend(&url), |ttl| spring(plain.clone(), ttl)).await;
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_spring_jdbc_lock_registry_and_distlock_exclude_each_other() {
    let db = pg_db();
    // The table as a Spring application's schema script creates it.
    db.query(PG_SCHEMA).unwrap();
    let url = exclusion_on(db.url(), pg_boxed, Spring::pg_boxed).await;
    // distlock wrote Spring's LOCK_KEY and a UUID CLIENT_ID.
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let reg = LockRegistry::new(backend);
    let g = reg.obtain("invoice/7").unwrap().lock().await.unwrap();
    let rows = db
        .query("SELECT LOCK_KEY, REGION, CLIENT_ID FROM INT_LOCK")
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0][0].as_deref(),
        Some(spring_uuid("invoice/7").as_str())
    );
    assert_eq!(rows[0][1].as_deref(), Some(REGION));
    assert_eq!(rows[0][2].as_ref().map(String::len), Some(36));
    g.release().await.unwrap();
    assert!(
        db.query("SELECT 1 FROM INT_LOCK").unwrap().is_empty(),
        "Spring-style delete"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_spring_jdbc_lock_registry_and_distlock_exclude_each_other() {
    let db = my_db();
    db.query(MYSQL_SCHEMA).unwrap();
    exclusion_on(db.url(), my_boxed, Spring::my_boxed).await;
}

/// distlock creates Spring's table itself when it is missing, and Spring's statements work on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_created_by_distlock_take_springs_statements() {
    let (pg_db, my_db) = (pg_db(), my_db());
    let pg_reg = LockRegistry::new(
        PostgresBackend::connect(&format!("{}?spring=true&region={REGION}", pg_db.url()))
            .await
            .unwrap(),
    );
    let my_reg = LockRegistry::new(
        MySqlBackend::connect(&format!("{}?spring=true&region={REGION}", my_db.url()))
            .await
            .unwrap(),
    );
    for (reg, java) in [
        (
            pg_reg,
            Spring::pg(pg_db.url(), Duration::from_secs(5)).await,
        ),
        (
            my_reg,
            Spring::my(my_db.url(), Duration::from_secs(5)).await,
        ),
    ] {
        let g = reg.obtain("k").unwrap().lock().await.unwrap();
        assert!(!java.acquire("k").await);
        g.release().await.unwrap();
        assert!(java.acquire("k").await);
        assert!(java.is_acquired("k").await);
        assert!(reg.obtain("k").unwrap().try_lock().await.is_err());
        assert!(java.delete("k").await);
    }
}

/// A registry that turns Spring mode on and changes nothing else (default options, so the
/// default prefix, and no region) meets a Spring application that changed nothing either:
/// both use Spring's default region `DEFAULT`, in both directions. A prefix given explicitly
/// is still the region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_mode_defaults_to_springs_default_region() {
    let (pg_db, my_db) = (pg_db(), my_db());
    let pg_url = format!("{}?spring=true", pg_db.url());
    let my_url = format!("{}?spring=true", my_db.url());
    let cases = [
        (
            pg_boxed(&pg_url).await,
            pg_boxed(&pg_url).await,
            Spring::pg(pg_db.url(), Duration::from_secs(10)).await,
        ),
        (
            my_boxed(&my_url).await,
            my_boxed(&my_url).await,
            Spring::my(my_db.url(), Duration::from_secs(10)).await,
        ),
    ];
    for (backend, named_backend, java) in cases {
        let ours = LockRegistry::from_backend(backend, RegistryOptions::default()).unwrap();
        let key = "orders:7";
        assert!(java.acquire(key).await);
        assert!(
            matches!(
                ours.obtain(key).unwrap().try_lock().await,
                Err(Error::NotAcquired { .. })
            ),
            "distlock acquired a lock Spring holds in region DEFAULT"
        );
        assert!(java.delete(key).await);
        let guard = ours.obtain(key).unwrap().try_lock().await.unwrap();
        assert!(
            !java.acquire(key).await,
            "Spring acquired a lock distlock holds"
        );
        guard.release().await.unwrap();

        // An explicit prefix is a region of its own, apart from Spring's default one.
        let named = LockRegistry::from_backend(
            named_backend,
            RegistryOptions::default().with_prefix("billing"),
        )
        .unwrap();
        assert!(java.acquire(key).await);
        let guard = named.obtain(key).unwrap().try_lock().await.unwrap();
        guard.release().await.unwrap();
        assert!(java.delete(key).await);
    }
}

/// The critical section of the contention test: a read-modify-write of `counter` that
/// overlaps with any other holder's, which `inside` detects.
async fn critical_section(inside: &AtomicBool, counter: &AtomicU64, cycles: &AtomicU64) {
    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
    let v = counter.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2)).await;
    counter.store(v + 1, Ordering::SeqCst);
    inside.store(false, Ordering::SeqCst);
    cycles.fetch_add(1, Ordering::SeqCst);
}

/// Spring's `LockRegistryLeaderInitiator` leads while it holds the lock of its role: on the
/// Spring layout that lock is distlock's election of the same name. While Spring leads, distlock
/// names Spring's `CLIENT_ID` as the leader and its candidate waits; when Spring lets go,
/// distlock leads and Spring's next attempt fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spring_leader_initiators_role_is_distlocks_election() {
    let db = pg_db();
    db.query(PG_SCHEMA).unwrap();
    let url = format!("{}?spring=true&region={REGION}", db.url());
    let spring = Spring::pg(db.url(), Duration::from_secs(30)).await;
    let role = "cluster-leader";
    assert!(spring.acquire(role).await, "Spring leads first");

    let reg = LockRegistry::new(PostgresBackend::connect(&url).await.unwrap());
    let election = reg.election(role).unwrap();
    let leader = election.leader().await.unwrap().expect("Spring leads");
    assert_eq!(leader.description, spring.id, "Spring's CLIENT_ID names it");
    let me = Owner::new("distlock-candidate").unwrap();
    assert!(matches!(
        election
            .campaign_for(me.clone(), Duration::from_millis(300))
            .await,
        Err(Error::NotAcquired { .. })
    ));

    assert!(spring.delete(role).await, "Spring yields");
    let leading = election
        .campaign_for(me, Duration::from_secs(10))
        .await
        .expect("distlock leads once Spring let go");
    let now = election.leader().await.unwrap().unwrap();
    assert_eq!(now.description, "distlock-candidate");
    assert!(now.term >> 10 >= leading.term() >> 10);
    assert!(!spring.acquire(role).await, "Spring cannot lead meanwhile");
    leading.resign().await.unwrap();
    assert!(
        spring.acquire(role).await,
        "Spring leads again after the resignation"
    );
}
