//! Passwords, TLS and URL errors of the PostgreSQL and MariaDB backends on real servers: wrong
//! passwords are clear errors that never show the password, a password goes only to a verified
//! server unless the URL opts in, and client certificates work.

mod common {
    pub mod sql;
}

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::sql::*;
use distlock::backends::mysql::MySqlBackend;
use distlock::backends::postgres::PostgresBackend;
use distlock::Error;
use distlock_testkit::mysql::MariaDbServer;
use distlock_testkit::postgres::PostgresServer;
use distlock_testkit::tls::TestCa;

/// A new MariaDB user (random name) with `password`, allowed everything in `db`.
fn my_user(db: &distlock_testkit::mysql::TestDatabase, password: &str) -> String {
    let user = format!("dl{:08x}", rand::random::<u32>());
    db.query(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'; \
         GRANT ALL ON `{}`.* TO '{user}'@'%'",
        db.name()
    ))
    .unwrap();
    user
}

#[tokio::test]
async fn unreachable_servers_are_unavailable_without_secrets() {
    for url in [
        "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2s",
        "mysql://u:hunter2@127.0.0.1:1/db?connect_timeout=2s",
    ] {
        let err = distlock::connect(url)
            .await
            .expect_err("nothing listens on port 1");
        assert!(matches!(err, Error::Unavailable { .. }), "{url}: {err:?}");
        assert!(err.is_retryable());
        let text = format!("{err} {err:?}");
        assert!(!text.contains("hunter2"), "{text}");
    }
}

#[tokio::test]
async fn unknown_url_parameters_are_named() {
    for (url, part) in [
        ("postgres://127.0.0.1/db?sslmode=sometimes", "sslmode"),
        ("postgres://127.0.0.1/db?colour=blue", "colour"),
        ("mysql://127.0.0.1/db?ssl-mode=sometimes", "ssl-mode"),
        ("mysql://127.0.0.1/db?colour=blue", "colour"),
        ("mysql://127.0.0.1/db?table=x;y", "table"),
    ] {
        match distlock::connect(url).await {
            Err(Error::InvalidConfig(m)) => assert!(m.contains(part), "{url}: {m}"),
            other => panic!("{url}: {other:?}"),
        }
    }
}

/// Password authentication and TLS on a throwaway PostgreSQL server (the machine's may trust
/// every loopback client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passwords_and_tls() {
    let server = Arc::new(PostgresServer::start().expect("postgresql"));
    let db = server.fresh_database().unwrap();

    let good = PostgresBackend::connect(db.url())
        .await
        .expect("right password");
    let debug = format!("{good:?}");
    let secret = url::Url::parse(db.url())
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    assert!(!debug.contains(&secret), "{debug}");

    let wrong = server.url_with_password(db.name(), "not-the-password");
    let err = PostgresBackend::connect(&wrong)
        .await
        .expect_err("wrong password");
    let text = err.to_string();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert!(text.contains("authentication failed"), "{text}");
    assert!(
        !text.contains("not-the-password") && !text.contains(&secret),
        "{text}"
    );
    assert!(!format!("{err:?}").contains("not-the-password"));

    // TLS: a test CA and a server certificate for "localhost", switched on with a reload.
    let ca = TestCa::new(&["localhost"], "certuser").expect("test CA");
    pg_enable_tls(&db, &ca);
    let ca = ca.path("ca.crt");

    let encrypted = |mode: &str| format!("{}?sslmode={mode}&application_name=tls-{mode}", db.url());
    let tls = PostgresBackend::connect(&encrypted("require"))
        .await
        .expect("sslmode=require accepts a self-signed certificate");
    acquire_and_release(&tls, "tls").await;
    let rows = db
        .query(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE s.ssl AND a.application_name = 'tls-require'",
        )
        .unwrap();
    assert_ne!(
        rows[0][0].as_deref(),
        Some("0"),
        "the connection is encrypted"
    );

    let err = PostgresBackend::connect(&encrypted("verify-full"))
        .await
        .expect_err("a self-signed certificate is not trusted");
    assert!(!err.to_string().contains(&secret));
    let with_ca = format!("{}&sslrootcert={}", encrypted("verify-ca"), ca.display());
    PostgresBackend::connect(&with_ca)
        .await
        .expect("verify-ca with the certificate as CA (its name is not checked)");
    let err = PostgresBackend::connect(&format!(
        "{}&sslrootcert={}",
        encrypted("verify-full"),
        ca.display()
    ))
    .await
    .expect_err("verify-full checks the name: the certificate is for localhost, not 127.0.0.1");
    assert!(!err.to_string().contains(&secret));
    drop(tls);
    drop(good);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_wrong_password_is_a_clear_error() {
    let db = my_db();
    let user = my_user(&db, "right-pw");
    let base = url::Url::parse(db.url()).unwrap();
    let with = |pw: &str| {
        let mut u = base.clone();
        u.set_username(&user).unwrap();
        u.set_password(Some(pw)).unwrap();
        // The machine's server offers no TLS: sending a password there needs the opt-in.
        u.query_pairs_mut()
            .append_pair("allow_insecure_auth", "true");
        u.to_string()
    };
    let good = MySqlBackend::connect(&with("right-pw")).await;
    let bad = MySqlBackend::connect(&with("wrong-pw")).await;
    let _ = db.query(&format!("DROP USER '{user}'@'%'"));
    let good = good.expect("right password");
    assert!(!format!("{good:?}").contains("right-pw"));
    let err = bad.expect_err("wrong password");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("access denied"), "{text}");
    assert!(!text.contains("wrong-pw") && !format!("{err:?}").contains("wrong-pw"));
}

/// A server that asks for the password in cleartext gets it only over TLS whose certificate
/// was verified, or with the URL's explicit `allow_insecure_auth=true`; the refusal is a
/// permanent error that names the way out and never the password. Client certificates work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cleartext_passwords_go_only_to_verified_servers() {
    let server = Arc::new(PostgresServer::start().expect("postgresql"));
    let db = server.fresh_database().unwrap();
    let secret = url::Url::parse(db.url())
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    let data_dir = db.query("SHOW data_directory").unwrap()[0][0]
        .clone()
        .unwrap();
    let hba = Path::new(&data_dir).join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!(
            "hostssl all certuser 127.0.0.1/32 cert\n\
             host all all 127.0.0.1/32 password\n\
             host all all ::1/128 password\n{old}"
        ),
    )
    .unwrap();
    db.query("CREATE ROLE certuser LOGIN SUPERUSER").unwrap();
    db.query("SELECT pg_reload_conf()").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let secret = &secret;
    let refused = |url: String| async move {
        let err = PostgresBackend::connect(&url)
            .await
            .expect_err("the password must not be sent");
        let text = format!("{err} {err:?}");
        assert!(matches!(err, Error::Backend { .. }), "{url}: {err:?}");
        assert!(text.contains("refused to send the password"), "{text}");
        assert!(text.contains("allow_insecure_auth"), "{text}");
        assert!(!text.contains(secret.as_str()), "{text}");
    };
    let port = url::Url::parse(db.url()).unwrap().port().unwrap();
    let at = |host: &str, query: &str| {
        let mut u = with_host(db.url(), host, port);
        u.set_query(Some(query));
        u.to_string()
    };
    // No TLS on the server yet: plain TCP, whatever the mode.
    refused(at("127.0.0.1", "sslmode=disable")).await;
    refused(db.url().to_owned()).await;
    PostgresBackend::connect(&at("127.0.0.1", "sslmode=disable&allow_insecure_auth=true"))
        .await
        .expect("the explicit opt-in sends it");

    let ca = TestCa::new(&["localhost"], "certuser").expect("test CA");
    pg_enable_tls(&db, &ca);
    let root = ca.path("ca.crt").display().to_string();
    // Encrypted, but the certificate is not verified: still refused.
    refused(at("127.0.0.1", "sslmode=require")).await;
    refused(at("localhost", "sslmode=prefer")).await;
    // Verified (the certificate names localhost): sent.
    for mode in ["prefer", "require", "verify-full"] {
        let b = PostgresBackend::connect(&at(
            "localhost",
            &format!("sslmode={mode}&sslrootcert={root}"),
        ))
        .await
        .unwrap_or_else(|e| panic!("sslmode={mode} with the CA: {e}"));
        acquire_and_release(&b, "verified").await;
    }

    // A client certificate instead of a password.
    let cert_url = |with_cert: bool| {
        let mut u = with_host(db.url(), "localhost", port);
        u.set_username("certuser").unwrap();
        u.set_password(None).unwrap();
        let mut q = format!("sslmode=verify-full&sslrootcert={root}");
        if with_cert {
            q.push_str(&format!(
                "&sslcert={}&sslkey={}",
                ca.path("client.crt").display(),
                ca.path("client.key").display()
            ));
        }
        u.set_query(Some(&q));
        u.to_string()
    };
    PostgresBackend::connect(&cert_url(true))
        .await
        .expect("the client certificate is accepted");
    PostgresBackend::connect(&cert_url(false))
        .await
        .expect_err("no client certificate, no access");
}

/// MariaDB: a password is not sent to a server that offers no TLS, unless the URL opts in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_passwords_are_not_sent_to_unverified_servers() {
    let db = my_db();
    let user = my_user(&db, "plain-secret");
    let with = |query: &str| {
        let mut u = url::Url::parse(db.url()).unwrap();
        u.set_username(&user).unwrap();
        u.set_password(Some("plain-secret")).unwrap();
        u.set_query(Some(query));
        u.to_string()
    };
    let mut errors = Vec::new();
    for query in [
        "",
        "ssl-mode=preferred",
        "ssl-mode=disabled",
        "ssl-mode=required",
    ] {
        errors.push(MySqlBackend::connect(&with(query)).await.err());
    }
    let opted_in = MySqlBackend::connect(&with("allow_insecure_auth=true")).await;
    let _ = db.query(&format!("DROP USER '{user}'@'%'"));
    for err in errors {
        let err = err.expect("the password must not be sent");
        let text = format!("{err} {err:?}");
        assert!(!err.is_retryable(), "{text}");
        assert!(text.contains("refusing to send the password"), "{text}");
        assert!(text.contains("allow_insecure_auth"), "{text}");
        assert!(!text.contains("plain-secret"), "{text}");
    }
    opted_in.expect("the explicit opt-in sends it");
}

/// MariaDB over TLS with a private CA: verified modes work, a certificate that cannot be
/// verified gets no password, `required` (not verified) needs the opt-in, and a user that
/// must show a client certificate can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_tls_with_a_private_ca_and_client_certificates() {
    let ca = TestCa::new(&["localhost"], "certuser").expect("test CA");
    let arg = |name: &str, file: &str| format!("--{name}={}", ca.path(file).display());
    let (c, k, a) = (
        arg("ssl-cert", "server.crt"),
        arg("ssl-key", "server.key"),
        arg("ssl-ca", "ca.crt"),
    );
    let server = Arc::new(MariaDbServer::start_with_args(&[&c, &k, &a]).expect("mariadb-server"));
    let db = server.fresh_database().unwrap();
    db.query(&format!(
        "CREATE USER 'pwuser'@'%' IDENTIFIED BY 'tls-secret' REQUIRE SSL; \
         GRANT ALL ON `{0}`.* TO 'pwuser'@'%'; \
         CREATE USER 'certuser'@'%' REQUIRE X509; \
         GRANT ALL ON `{0}`.* TO 'certuser'@'%'",
        db.name()
    ))
    .unwrap();
    let root = ca.path("ca.crt").display().to_string();
    let port = url::Url::parse(db.url()).unwrap().port().unwrap();
    let at = |host: &str, user: &str, password: Option<&str>, query: &str| {
        let mut u = with_host(db.url(), host, port);
        u.set_username(user).unwrap();
        u.set_password(password).unwrap();
        u.set_query(Some(query));
        u.to_string()
    };
    // The certificate names localhost. (mysql_async's rustls verifier checks the name even
    // with verify_ca, so that mode needs the name as well.)
    let with =
        |user: &str, password: Option<&str>, query: &str| at("localhost", user, password, query);
    let pw = |query: &str| with("pwuser", Some("tls-secret"), query);
    let works = |url: String| async move {
        let b = MySqlBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        acquire_and_release(&b, "tls").await;
    };
    // The user requires TLS, so every success below went over TLS.
    works(pw(&format!("ssl-mode=verify_ca&ssl-ca={root}"))).await;
    works(pw(&format!("ssl-mode=verify_identity&ssl-ca={root}"))).await;
    works(pw(&format!("ssl-mode=preferred&ssl-ca={root}"))).await;
    works(pw("ssl-mode=required&allow_insecure_auth=true")).await;
    // The certificate names localhost, not 127.0.0.1; nor is it signed by a public CA.
    for (host, query) in [
        (
            "127.0.0.1",
            format!("ssl-mode=verify_identity&ssl-ca={root}"),
        ),
        ("localhost", "ssl-mode=preferred".to_owned()),
        ("localhost", "ssl-mode=verify_ca".to_owned()),
    ] {
        let err = MySqlBackend::connect(&at(host, "pwuser", Some("tls-secret"), &query))
            .await
            .expect_err("a certificate that cannot be verified gets no password");
        let text = format!("{err} {err:?}");
        assert!(matches!(err, Error::Backend { .. }), "{query}: {text}");
        assert!(text.contains("TLS"), "{query}: {text}");
        assert!(!text.contains("tls-secret"), "{text}");
    }
    match MySqlBackend::connect(&pw("ssl-mode=required")).await {
        Err(Error::InvalidConfig(m)) => {
            assert!(
                m.contains("allow_insecure_auth") && !m.contains("tls-secret"),
                "{m}"
            )
        }
        other => panic!(
            "ssl-mode=required sent the password: {:?}",
            other.map(|_| ())
        ),
    }
    // A client certificate instead of a password.
    let client = format!(
        "ssl-mode=verify_ca&ssl-ca={root}&ssl-cert={}&ssl-key={}",
        ca.path("client.crt").display(),
        ca.path("client.key").display()
    );
    works(with("certuser", None, &client)).await;
    MySqlBackend::connect(&with(
        "certuser",
        None,
        &format!("ssl-mode=verify_ca&ssl-ca={root}"),
    ))
    .await
    .expect_err("no client certificate, no access");
}
