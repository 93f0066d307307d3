use super::my::{hex_literal, My};
use super::pg_text::pg_table;
use super::*;

#[test]
fn identifiers_are_quoted_and_folded() {
    assert_eq!(
        pg_table(Some("Infra"), "INT_LOCK"),
        "\"infra\".\"int_lock\""
    );
    let my = My::new(Some("app"), "INT_LOCK", true);
    assert!(my.create().contains("`app`.`INT_LOCK`"));
}

#[test]
fn values_cannot_escape_their_literals() {
    assert_eq!(hex_literal(b"'; --"), "X'273b202d2d'");
    let my = My::new(None, "t", false);
    let sql = my.acquire(
        &MyLock {
            region: "lock",
            key: "'; DROP TABLE t; --",
            token: "00ff",
            described: "",
        },
        1000,
        2000,
    );
    assert!(!sql.contains("DROP"), "{sql}");
}

#[test]
fn prepared_statements_take_their_values_in_order() {
    let my = My::new(None, "t", false);
    let p = my.release_prepared();
    assert_eq!(p.names, ["region", "key", "tok"]);
    assert_eq!(p.sql.matches('?').count(), 3);
    // Time literals keep their colons.
    assert!(p.sql.contains("'1970-01-01 00:00:00'"), "{}", p.sql);
    for defer in [None, Some(1000)] {
        let a = my.acquire_existing_prepared(defer);
        assert_eq!(a.sql.matches('?').count(), a.names.len());
        assert!(a.names.contains(&"lease") && a.names.contains(&"half"));
        assert_eq!(a.sql.contains("- 1000"), defer.is_some(), "{}", a.sql);
    }
}

#[test]
#[should_panic(expected = "hex digits")]
fn tokens_must_be_hex() {
    let my = My::new(None, "t", false);
    my.release(&MyLock {
        region: "r",
        key: "k",
        token: "x'",
        described: "",
    });
}
