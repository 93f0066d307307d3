//! A JDBC client as the Java lock libraries' statements reach the server (Spring's
//! `JdbcLockRegistry`, ShedLock's JDBC provider): the connection as pgjdbc and Connector/J
//! make it, `?` placeholders, and Java's UTC `LocalDateTime` values.

#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One Java process's connection.
pub enum Db {
    Pg(tokio_postgres::Client),
    My(mysql_async::Pool),
}

impl Db {
    pub async fn pg(url: &str) -> Db {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        Db::Pg(client)
    }

    pub fn my(url: &str) -> Db {
        // Connector/J reports found (not changed) rows, as client_found_rows does.
        let opts = mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(url).unwrap())
            .client_found_rows(true);
        Db::My(mysql_async::Pool::new(opts))
    }
}

/// JDBC's `?` placeholders as PostgreSQL's `$n`, as pgjdbc sends them.
pub fn pg_sql(sql: &str) -> String {
    let mut out = String::new();
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

/// `LocalDateTime.now(ZoneOffset.UTC)` as a MySQL DATETIME value.
pub fn my_time(t: SystemTime) -> mysql_async::Value {
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    mysql_async::Value::Date(
        year as u16,
        month as u8,
        day as u8,
        (rem / 3600) as u8,
        (rem % 3600 / 60) as u8,
        (rem % 60) as u8,
        d.subsec_micros(),
    )
}

/// [`my_time`] at millisecond precision (`Instant` truncated as ShedLock's are).
pub fn my_time_ms(t: SystemTime) -> mysql_async::Value {
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    my_time(UNIX_EPOCH + Duration::from_millis(d.as_millis() as u64))
}
