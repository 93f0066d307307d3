//! Holder descriptions on the SQL servers' native layout, with data distlock did not write
//! this way: a lease table made by an older distlock (no `owner` column), which the backend
//! upgrades when it connects, with a hold already in it; and a foreign client's row. Both
//! show "unknown", and new acquisitions on the upgraded table record their owner.

mod common {
    pub mod sql;
}

use std::time::Duration;

use common::sql::{my, my_db, pg, pg_db, registry};
use distlock::{Owner, RegistryOptions, UNKNOWN_OWNER};

// The tables as distlock made them before descriptions were recorded.
const PG_OLD: &str = "CREATE TABLE distlock_locks (
    region TEXT NOT NULL, lock_key TEXT NOT NULL, token TEXT NULL, fence BIGINT NOT NULL,
    created_ms BIGINT NOT NULL, expires_ms BIGINT NOT NULL, wanted_ms BIGINT NULL,
    PRIMARY KEY (region, lock_key));
CREATE TABLE distlock_locks_holds (
    region TEXT NOT NULL, lock_key TEXT NOT NULL, token TEXT NOT NULL, kind TEXT NOT NULL,
    permits INTEGER NOT NULL, expires_ms BIGINT NOT NULL, fence BIGINT NOT NULL,
    PRIMARY KEY (region, lock_key, token))";
const MY_OLD: &str = "CREATE TABLE distlock_locks (
    region VARBINARY(256) NOT NULL, lock_key VARBINARY(1024) NOT NULL,
    token CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL, fence BIGINT NOT NULL,
    created_ms BIGINT NOT NULL, expires_ms BIGINT NOT NULL, wanted_ms BIGINT NULL,
    PRIMARY KEY (region, lock_key)) ENGINE=InnoDB;
CREATE TABLE distlock_locks_holds (
    region VARBINARY(256) NOT NULL, lock_key VARBINARY(1024) NOT NULL,
    token CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kind CHAR(1) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, permits INT NOT NULL,
    expires_ms BIGINT NOT NULL, fence BIGINT NOT NULL,
    PRIMARY KEY (region, lock_key, token)) ENGINE=InnoDB";

/// A hold as an older distlock (or a foreign client) writes it: a token, a lease for a minute.
fn old_hold(key: &str, now_ms: &str) -> String {
    format!(
        "INSERT INTO distlock_locks (region, lock_key, token, fence, created_ms, expires_ms, wanted_ms) \
         VALUES ('lock', '{key}', '0123456789abcdef0123456789abcdef', 1, {now_ms}, {now_ms} + 60000, NULL)"
    )
}

async fn upgraded(backend: std::sync::Arc<dyn distlock::Backend>, has_column: impl Fn() -> bool) {
    let opts = || RegistryOptions::default().with_lease(Duration::from_secs(10));
    let reg = registry(
        backend,
        opts().with_owner(Owner::new("upgraded:1").unwrap()),
    );
    let old = reg.obtain("held-before").unwrap();
    let info = old
        .inspect()
        .await
        .unwrap()
        .expect("the old hold is still held");
    assert_eq!(info.owners, [UNKNOWN_OWNER], "a hold without a description");
    assert!(has_column(), "the owner column was not added");
    assert!(old.try_lock().await.is_err(), "the old hold still excludes");

    let g = reg.obtain("new").unwrap().lock().await.unwrap();
    let info = reg.obtain("new").unwrap().inspect().await.unwrap().unwrap();
    assert_eq!(info.owners, ["upgraded:1"]);
    let listed = reg.backend().list("lock").await.unwrap();
    let mut owners: Vec<_> = listed.iter().flat_map(|l| l.info.owners.clone()).collect();
    owners.sort();
    assert_eq!(owners, ["unknown", "upgraded:1"]);
    g.release().await.unwrap();
    assert!(reg
        .obtain("new")
        .unwrap()
        .inspect()
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_upgrades_an_older_table_and_shows_unknown_for_its_holds() {
    let db = pg_db();
    db.query(PG_OLD).unwrap();
    db.query(&old_hold(
        "held-before",
        "(EXTRACT(EPOCH FROM now()) * 1000)::bigint",
    ))
    .unwrap();
    let has_column = || {
        db.query(
            "SELECT count(*) FROM information_schema.columns \
             WHERE table_name IN ('distlock_locks', 'distlock_locks_holds') \
               AND column_name = 'owner'",
        )
        .unwrap()[0][0]
            .as_deref()
            == Some("2")
    };
    upgraded(pg(db.url()).await, has_column).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_upgrades_an_older_table_and_shows_unknown_for_its_holds() {
    let db = my_db();
    for ddl in MY_OLD.split(';') {
        db.query(ddl).unwrap();
    }
    db.query(&old_hold(
        "held-before",
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)",
    ))
    .unwrap();
    let has_column = || {
        db.query(
            "SELECT COUNT(*) FROM information_schema.columns \
             WHERE table_schema = DATABASE() \
               AND table_name IN ('distlock_locks', 'distlock_locks_holds') \
               AND column_name = 'owner'",
        )
        .unwrap()[0][0]
            .as_deref()
            == Some("2")
    };
    upgraded(my(db.url()).await, has_column).await;
}

// Spring's own DDL for INT_LOCK (schema-postgresql.sql, schema-mysql.sql).
const PG_SPRING: &str = "CREATE TABLE INT_LOCK (LOCK_KEY CHAR(36) NOT NULL,
    REGION VARCHAR(100) NOT NULL, CLIENT_ID CHAR(36), CREATED_DATE TIMESTAMP NOT NULL,
    EXPIRED_AFTER TIMESTAMP NOT NULL, constraint INT_LOCK_PK primary key (LOCK_KEY, REGION))";
const MY_SPRING: &str = "CREATE TABLE INT_LOCK (LOCK_KEY CHAR(36) NOT NULL,
    REGION VARCHAR(100) NOT NULL, CLIENT_ID CHAR(36), CREATED_DATE DATETIME(6) NOT NULL,
    EXPIRED_AFTER DATETIME(6) NOT NULL, constraint INT_LOCK_PK primary key (LOCK_KEY, REGION))
    ENGINE=InnoDB";

/// Spring mode on a table Spring made, with `create_table=false`: no owners table, so nothing
/// is recorded, locking works as before and a hold shows its `CLIENT_ID`.
async fn spring_table_without_owners(backend: std::sync::Arc<dyn distlock::Backend>) {
    let reg = registry(
        backend,
        RegistryOptions::default().with_lease(Duration::from_secs(10)),
    );
    let g = reg.obtain("k").unwrap().lock().await.unwrap();
    let info = reg.obtain("k").unwrap().inspect().await.unwrap().unwrap();
    assert_eq!(info.owners.len(), 1);
    assert_eq!(info.owners[0].len(), 36, "the CLIENT_ID: {:?}", info.owners);
    assert!(reg.obtain("k").unwrap().try_lock().await.is_err());
    g.release().await.unwrap();
    assert!(reg.obtain("k").unwrap().inspect().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_spring_table_without_owners_table_keeps_working() {
    let db = pg_db();
    db.query(PG_SPRING).unwrap();
    let url = format!("{}?spring=true&create_table=false", db.url());
    spring_table_without_owners(pg(&url).await).await;
    let owners = db
        .query("SELECT to_regclass('int_lock_owners') IS NULL")
        .unwrap();
    assert_eq!(owners[0][0].as_deref(), Some("t"), "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_spring_table_without_owners_table_keeps_working() {
    let db = my_db();
    db.query(MY_SPRING).unwrap();
    let url = format!("{}?spring=true&create_table=false", db.url());
    spring_table_without_owners(my(&url).await).await;
    let owners = db
        .query(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = 'INT_LOCK_OWNERS'",
        )
        .unwrap();
    assert_eq!(owners[0][0].as_deref(), Some("0"), "nothing was created");
}
