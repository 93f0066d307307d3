//! Unit tests of `queue.rs`: names, order and places.

use super::*;

#[test]
fn uuid_is_curator_shaped_and_unique_per_token() {
    let t = Token::from(0x0123_4567_89ab_cdef_0011_2233_4455_6677u128);
    assert_eq!(uuid_of(t), "01234567-89ab-cdef-0011-223344556677");
    assert_eq!(
        protected_prefix(t),
        "_c_01234567-89ab-cdef-0011-223344556677-"
    );
}

#[test]
fn contenders_sort_by_sequence_like_curator() {
    let children: Vec<String> = [
        "_c_b-lock-0000000010",
        "_c_a-lock-0000000002",
        "foreign",
        "_c_c-lock-0000000003",
        "x-lock-",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let names: Vec<&str> = sort_contenders(&children).iter().map(|c| c.name).collect();
    assert_eq!(
        names,
        [
            "_c_a-lock-0000000002",
            "_c_c-lock-0000000003",
            "_c_b-lock-0000000010"
        ]
    );
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn mutexes_readers_and_writers_share_one_order() {
    let children = names(&[
        "_c_w-__WRIT__0000000003",
        "_c_r1-__READ__0000000001",
        "_c_m-lock-0000000004",
        "_c_r2-__READ__0000000002",
        "_c_r3-__READ__0000000005",
        "locks",
        "leases",
        "0a1b__lock__0000000000",
    ]);
    let sorted = sort_contenders(&children);
    let order: Vec<(i64, Role)> = sorted.iter().map(|c| (c.seq, c.role)).collect();
    assert_eq!(
        order,
        [
            (1, Role::Read),
            (2, Role::Read),
            (3, Role::Write),
            (4, Role::Mutex),
            (5, Role::Read)
        ]
    );
    // Readers before any exclusive contender hold together.
    assert_eq!(place(&sorted, "_c_r1-__READ__0000000001"), Place::First);
    assert_eq!(place(&sorted, "_c_r2-__READ__0000000002"), Place::First);
    // A writer waits for the readers before it, the mutex for the writer, and a later
    // reader for the nearest exclusive contender before it (writer preference).
    assert_eq!(
        place(&sorted, "_c_w-__WRIT__0000000003"),
        Place::Behind("_c_r2-__READ__0000000002")
    );
    assert_eq!(
        place(&sorted, "_c_m-lock-0000000004"),
        Place::Behind("_c_w-__WRIT__0000000003")
    );
    assert_eq!(
        place(&sorted, "_c_r3-__READ__0000000005"),
        Place::Behind("_c_m-lock-0000000004")
    );
    assert_eq!(place(&sorted, "_c_gone-lock-0000000009"), Place::Gone);
}

#[test]
fn a_tie_counts_as_before() {
    // Curator 5.5's downgrade: a non-sequential reader with its writer's sequence.
    let children = names(&["_c_b-__WRIT__0000000007", "_c_a-__READ__0000000007"]);
    let sorted = sort_contenders(&children);
    assert_eq!(
        place(&sorted, "_c_a-__READ__0000000007"),
        Place::Behind("_c_b-__WRIT__0000000007")
    );
    assert_eq!(
        place(&sorted, "_c_b-__WRIT__0000000007"),
        Place::Behind("_c_a-__READ__0000000007")
    );
}

#[test]
fn leases_sort_by_their_sequence() {
    let children = names(&["_c_b-lease-0000000011", "_c_a-lease-0000000002", "foreign"]);
    assert_eq!(
        sort_leases(&children),
        ["foreign", "_c_a-lease-0000000002", "_c_b-lease-0000000011"]
    );
}
