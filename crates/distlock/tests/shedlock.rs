//! ShedLock compatibility of the SQL backends: distlock with `layout=shedlock` and a client
//! that sends the statements of ShedLock's JDBC provider (`JdbcTemplateLockProvider` with
//! `usingDbTime()`: PostgreSQL's `INSERT … ON CONFLICT`, MySQL's `INSERT IGNORE` then
//! `UPDATE`; and the default provider's unlock `UPDATE shedlock SET lock_until = ? WHERE
//! name = ? AND locked_by = ?` with the client's UTC time) on its own connection share the
//! `shedlock` table and exclude each other both ways, on PostgreSQL and on MariaDB.

mod common {
    pub mod jdbc;
    pub mod sql;
}

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::jdbc::{my_time_ms, pg_sql, Db};
use common::sql::{my, my_db, pg, pg_db};
use distlock::{Backend, Error, LockRegistry, Owner, RegistryOptions};
use mysql_async::prelude::Queryable;

// ShedLock's PostgreSQL statements with usingDbTime() (PostgresSqlServerTimeStatementsSource),
// with JDBC's named parameters as `$n`. pgjdbc sends the interval as a string parameter,
// which `::text` declares here.
const PG_NOW: &str = "timezone('utc', CURRENT_TIMESTAMP)";
fn pg_insert() -> String {
    let at_most = format!("{PG_NOW} + cast($2::text as interval)");
    format!(
        "INSERT INTO shedlock(name, lock_until, locked_at, locked_by) \
         VALUES($1, {at_most}, {PG_NOW}, $3) \
         ON CONFLICT (name) DO UPDATE SET lock_until = {at_most}, locked_at = {PG_NOW}, \
         locked_by = $3 WHERE shedlock.lock_until <= {PG_NOW}"
    )
}
fn pg_unlock_db_time() -> String {
    let at_least = "locked_at + cast($3::text as interval)";
    format!(
        "UPDATE shedlock SET lock_until = CASE WHEN {at_least} > {PG_NOW} THEN {at_least} \
         ELSE {PG_NOW} END WHERE name = $1 AND locked_by = $2"
    )
}
// ShedLock's MySQL statements with usingDbTime() (MySqlServerTimeStatementsSource).
const MY_INSERT: &str = "INSERT IGNORE INTO shedlock(name, lock_until, locked_at, locked_by) \
     VALUES(?, TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3)), UTC_TIMESTAMP(3), ?)";
const MY_UPDATE: &str = "UPDATE shedlock SET \
     lock_until = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3)), locked_at = UTC_TIMESTAMP(3), \
     locked_by = ? WHERE name = ? AND lock_until <= UTC_TIMESTAMP(3)";
const MY_UNLOCK_DB_TIME: &str = "UPDATE shedlock SET lock_until = \
     IF (TIMESTAMPADD(MICROSECOND, ?, locked_at) > UTC_TIMESTAMP(3), \
     TIMESTAMPADD(MICROSECOND, ?, locked_at), UTC_TIMESTAMP(3)) \
     WHERE name = ? AND locked_by = ?";
// The default (client time) provider's unlock, the same on every database.
const UNLOCK: &str = "UPDATE shedlock SET lock_until = ? WHERE name = ? AND locked_by = ?";

// ShedLock's documented tables.
const PG_SCHEMA: &str = "CREATE TABLE shedlock(name VARCHAR(64) NOT NULL, \
     lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, \
     locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))";
const MY_SCHEMA: &str = "CREATE TABLE shedlock(name VARCHAR(64) NOT NULL, \
     lock_until TIMESTAMP(3) NOT NULL, \
     locked_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
     locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))";

/// One ShedLock process: its connection and the host name it writes as `locked_by`.
struct ShedLock {
    db: Db,
    host: &'static str,
}

impl ShedLock {
    async fn pg(url: &str, host: &'static str) -> ShedLock {
        ShedLock {
            db: Db::pg(url).await,
            host,
        }
    }

    fn my(url: &str, host: &'static str) -> ShedLock {
        ShedLock {
            db: Db::my(url),
            host,
        }
    }

    /// `StorageBasedLockProvider.lock`: the insert, then (MySQL) the update.
    async fn lock(&self, name: &str, at_most: Duration) -> bool {
        match &self.db {
            Db::Pg(c) => {
                let interval = format!("{} milliseconds", at_most.as_millis());
                c.execute(&pg_insert(), &[&name, &interval, &self.host])
                    .await
                    .unwrap()
                    > 0
            }
            Db::My(pool) => {
                let mut conn = pool.get_conn().await.unwrap();
                let micros = at_most.as_micros() as u64;
                conn.exec_drop(MY_INSERT, (name, micros, self.host))
                    .await
                    .unwrap();
                if conn.affected_rows() > 0 {
                    return true;
                }
                conn.exec_drop(MY_UPDATE, (micros, self.host, name))
                    .await
                    .unwrap();
                conn.affected_rows() > 0
            }
        }
    }

    /// The default provider's unlock: `lock_until` = the client's UTC now.
    async fn unlock(&self, name: &str) -> u64 {
        let now = SystemTime::now();
        match &self.db {
            Db::Pg(c) => c
                .execute(&pg_sql(UNLOCK), &[&now, &name, &self.host])
                .await
                .unwrap(),
            Db::My(pool) => {
                let mut conn = pool.get_conn().await.unwrap();
                conn.exec_drop(UNLOCK, (my_time_ms(now), name, self.host))
                    .await
                    .unwrap();
                conn.affected_rows()
            }
        }
    }

    /// The `usingDbTime()` unlock with no lock-at-least.
    async fn unlock_db_time(&self, name: &str) -> u64 {
        match &self.db {
            Db::Pg(c) => c
                .execute(
                    &pg_unlock_db_time(),
                    &[&name, &self.host, &"0 milliseconds"],
                )
                .await
                .unwrap(),
            Db::My(pool) => {
                let mut conn = pool.get_conn().await.unwrap();
                conn.exec_drop(MY_UNLOCK_DB_TIME, (0u64, 0u64, name, self.host))
                    .await
                    .unwrap();
                conn.affected_rows()
            }
        }
    }

    /// Whether the row exists with `lock_until <= now` (free for ShedLock's update).
    async fn row_free(&self, name: &str) -> Option<bool> {
        match &self.db {
            Db::Pg(c) => c
                .query_opt(
                    &format!("SELECT lock_until <= {PG_NOW} FROM shedlock WHERE name = $1"),
                    &[&name],
                )
                .await
                .unwrap()
                .map(|r| r.get(0)),
            Db::My(pool) => {
                let mut conn = pool.get_conn().await.unwrap();
                let v: Option<i64> = conn
                    .exec_first(
                        "SELECT lock_until <= UTC_TIMESTAMP(3) FROM shedlock WHERE name = ?",
                        (name,),
                    )
                    .await
                    .unwrap();
                v.map(|x| x > 0)
            }
        }
    }
}

/// Every interop property on one database: `backend` is distlock's (`layout=shedlock`),
/// `shed` a ShedLock process on host `shedlock-host-1`.
async fn interop(backend: Arc<dyn Backend>, shed: ShedLock) {
    let reg = LockRegistry::from_backend(
        backend.clone(),
        RegistryOptions::default().with_lease(Duration::from_secs(10)),
    )
    .unwrap();
    let me = Owner::new("distlock-app:1").unwrap();
    let lock = reg.obtain("report").unwrap().with_owner(me);

    // A ShedLock holder excludes distlock, which shows its host name as the owner.
    assert!(shed.lock("report", Duration::from_secs(30)).await);
    assert!(matches!(
        lock.try_lock().await,
        Err(Error::NotAcquired { .. })
    ));
    let info = lock.inspect().await.unwrap().expect("held by ShedLock");
    assert_eq!(info.owners, ["shedlock-host-1"]);
    let listed = backend.list("lock").await.unwrap();
    assert!(
        listed
            .iter()
            .any(|l| l.key == "report" && l.info.owners == ["shedlock-host-1"]),
        "{listed:?}"
    );

    // ShedLock's release of its own row frees it for distlock.
    assert_eq!(shed.unlock("report").await, 1);
    let guard = lock.try_lock().await.expect("free after ShedLock's unlock");
    assert_eq!(
        lock.inspect().await.unwrap().unwrap().owners,
        ["distlock-app:1"]
    );

    // distlock's holder excludes ShedLock's insert and update, and ShedLock's unlock (which
    // matches its host name) cannot release it.
    assert!(!shed.lock("report", Duration::from_secs(30)).await);
    assert_eq!(shed.unlock("report").await, 0);
    assert_eq!(shed.unlock_db_time("report").await, 0);
    assert_eq!(shed.row_free("report").await, Some(false));
    let other = LockRegistry::from_backend(backend.clone(), RegistryOptions::default()).unwrap();
    assert!(other.obtain("report").unwrap().try_lock().await.is_err());

    // distlock's release keeps the row, with lock_until <= now: ShedLock's update takes it.
    guard.release().await.unwrap();
    assert_eq!(shed.row_free("report").await, Some(true));
    assert!(shed.lock("report", Duration::from_secs(30)).await);
    assert!(lock.try_lock().await.is_err());
    assert_eq!(shed.unlock_db_time("report").await, 1);
    // ShedLock's unlock writes the server's `now` into a millisecond column, which may round it
    // up by half a millisecond: the row is free once the server's clock has passed it.
    for _ in 0..100 {
        if shed.row_free("report").await == Some(true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(shed.row_free("report").await, Some(true));
    assert!(lock.try_lock().await.is_ok());

    // A key longer than ShedLock's name column is a typed error.
    assert!(matches!(
        reg.obtain(&"k".repeat(65)).unwrap().try_lock().await,
        Err(Error::InvalidKey(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shedlock_and_distlock_exclude_each_other() {
    let db = pg_db();
    // The table as a ShedLock application's schema script creates it.
    db.query(PG_SCHEMA).unwrap();
    let backend = pg(&format!("{}?layout=shedlock", db.url())).await;
    interop(backend, ShedLock::pg(db.url(), "shedlock-host-1").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_shedlock_and_distlock_exclude_each_other() {
    let db = my_db();
    db.query(MY_SCHEMA).unwrap();
    let backend = my(&format!("{}?layout=shedlock", db.url())).await;
    interop(backend, ShedLock::my(db.url(), "shedlock-host-1")).await;
}

/// distlock creates ShedLock's table when it is missing, and ShedLock's statements work on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_created_by_distlock_take_shedlocks_statements() {
    let (pg_db, my_db) = (pg_db(), my_db());
    let pg_backend = pg(&format!("{}?layout=shedlock", pg_db.url())).await;
    interop(
        pg_backend,
        ShedLock::pg(pg_db.url(), "shedlock-host-1").await,
    )
    .await;
    let my_backend = my(&format!("{}?layout=shedlock", my_db.url())).await;
    interop(my_backend, ShedLock::my(my_db.url(), "shedlock-host-1")).await;
}
