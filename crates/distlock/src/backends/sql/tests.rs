//! Unit tests of the SQL options, URL parsing and Spring's key form.

use super::*;

/// The statement that counts the rows of the holds table (`places`: the waiting writers'
/// only), for the checks of `kinds::checks` on every SQL backend.
pub(super) fn count_holds(places: bool) -> String {
    let filter = if places { " WHERE kind = 'w'" } else { "" };
    format!("SELECT COUNT(*) FROM distlock_locks_holds{filter}")
}

/// The one number that a query on a test database answered.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(super) fn number(rows: std::io::Result<Vec<Vec<Option<String>>>>) -> usize {
    rows.unwrap()[0][0].as_deref().unwrap().parse().unwrap()
}

#[test]
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn spring_keys_match_java() {
    // Values of java.util.UUID.nameUUIDFromBytes(s.getBytes(StandardCharsets.UTF_8)).
    assert_eq!(
        spring_lock_key("foo"),
        "acbd18db-4cc2-385c-adef-654fccc4a4d8"
    );
    assert_eq!(spring_lock_key(""), "d41d8cd9-8f00-3204-a980-0998ecf8427e");
    assert_eq!(
        spring_lock_key("voucher:42").len(),
        36,
        "always the 36-character form"
    );
    let upper = "0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9";
    assert_eq!(spring_lock_key(upper), upper.to_ascii_lowercase());
    assert_ne!(
        spring_lock_key("0A1B2C3D4E5F60718293A4B5C6D7E8F9").len(),
        32
    );
}

#[test]
fn token_as_uuid() {
    let t = Token::from(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef_u128);
    assert_eq!(token_uuid(t), "01234567-89ab-cdef-0123-456789abcdef");
}

#[test]
fn urls_parse_and_name_the_bad_part() {
    let p = parse_url(
        "postgres",
        &["postgres", "postgresql"],
        "postgres://u:p%40ss@db.example:6543/app?table=t1&schema=s&pool_size=3&connect_timeout=250ms&sslmode=require",
    )
    .unwrap();
    assert_eq!(p.host, "db.example");
    assert_eq!(p.port, Some(6543));
    assert_eq!(p.user.as_deref(), Some("u"));
    assert_eq!(p.password.as_deref(), Some("p@ss"));
    assert_eq!(p.database.as_deref(), Some("app"));
    assert_eq!(p.options.table, "t1");
    assert_eq!(p.options.schema.as_deref(), Some("s"));
    assert_eq!(p.options.pool_size, 3);
    assert_eq!(p.options.connect_timeout, Duration::from_millis(250));
    assert_eq!(p.rest, vec![("sslmode".to_owned(), "require".to_owned())]);
    assert!(!format!("{p:?}").contains("p@ss"));

    let p = parse_url(
        "mysql",
        &["mysql"],
        "mysql://h/db?request_timeout=1500ms&allow_insecure_auth=true",
    )
    .unwrap();
    assert_eq!(p.options.request_timeout, Duration::from_millis(1500));
    assert!(p.options.allow_insecure_auth);
    let d = parse_url("mysql", &["mysql"], "mysql://h/db")
        .unwrap()
        .options;
    assert_eq!(d.request_timeout, DEFAULT_REQUEST_TIMEOUT);
    assert!(!d.allow_insecure_auth, "insecure authentication is opt-in");
    assert_eq!(
        d.renewal_timeout(Duration::from_secs(2)),
        Duration::from_secs(2)
    );
    assert_eq!(
        d.renewal_timeout(Duration::from_secs(60)),
        DEFAULT_REQUEST_TIMEOUT
    );

    let spring = parse_url("mysql", &["mysql"], "mysql://h/db?spring=true").unwrap();
    assert_eq!(spring.options.table, SPRING_TABLE);
    assert!(spring.options.spring);
    let shed = parse_url("mysql", &["mysql"], "mysql://h/db?layout=shedlock").unwrap();
    assert_eq!(shed.options.table, SHEDLOCK_TABLE);
    assert!(shed.options.shedlock && !shed.options.native());
    let named = parse_url(
        "mysql",
        &["mysql"],
        "mysql://h/db?layout=shedlock&table=jobs_lock",
    );
    assert_eq!(named.unwrap().options.table, "jobs_lock");

    for (url, part) in [
        ("postgres://h/db?layout=other", "layout"),
        ("postgres://h/db?layout=shedlock&region=r", "region"),
        ("postgres://h/db?layout=shedlock&spring=true", "one layout"),
        ("postgres://", "host"),
        ("postgres:///db", "host"),
        ("postgres://h:99999/db", "malformed"),
        ("postgres://h/db?table=bad-name", "table"),
        ("postgres://h/db?pool_size=0", "pool_size"),
        ("postgres://h/db?pool_size=x", "pool_size"),
        ("postgres://h/db?connect_timeout=soon", "connect_timeout"),
        ("postgres://h/db?request_timeout=0", "request_timeout"),
        (
            "postgres://h/db?allow_insecure_auth=maybe",
            "allow_insecure_auth",
        ),
        ("postgres://h/db?spring=maybe", "spring"),
        ("postgres://h/db?table=a&table=b", "repeated"),
        ("postgres://h/a/b", "database"),
        ("redis://h/db", "scheme"),
    ] {
        match parse_url("postgres", &["postgres", "postgresql"], url) {
            Err(Error::InvalidConfig(m)) => assert!(m.contains(part), "{url}: {m}"),
            Err(other) => panic!("{url}: {other:?}"),
            Ok(p) => panic!("{url}: accepted {p:?}"),
        }
    }
}

#[test]
fn leases_round_up() {
    assert_eq!(lease_ms(Duration::from_micros(1)), 1);
    assert_eq!(lease_ms(Duration::from_millis(30_000)), 30_000);
    assert_eq!(lease_ms(Duration::MAX), MAX_LEASE_MS);
}

#[test]
fn secrets_are_scrubbed() {
    assert_eq!(
        scrub("password p@ss! was wrong p%40ss%21".into(), Some("p@ss!")),
        "password *** was wrong ***"
    );
}

#[test]
fn spring_mode_maps_the_registry_default_prefix_to_springs_default_region() {
    // The constant must follow the registry's default, or Spring mode stops meeting Spring.
    assert_eq!(
        crate::RegistryOptions::default().prefix(),
        REGISTRY_DEFAULT_PREFIX
    );
    let spring = SqlOptions::spring_compatible();
    assert_eq!(spring.region_for(REGISTRY_DEFAULT_PREFIX), "DEFAULT");
    assert_eq!(spring.region_for("billing"), "billing", "a prefix wins");
    let named = SqlOptions::spring_compatible().region("orders");
    assert_eq!(named.region_for(REGISTRY_DEFAULT_PREFIX), "orders");
    assert_eq!(named.region_for("billing"), "orders", "a region wins");
    let native = SqlOptions::default();
    assert_eq!(native.region_for(REGISTRY_DEFAULT_PREFIX), "lock");
}
