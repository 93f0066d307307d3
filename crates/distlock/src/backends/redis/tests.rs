use std::time::Duration;

use super::keys::{crc16, hash_slot, sibling_key};
use super::ms;

#[test]
fn leases_are_rounded_up_to_whole_milliseconds() {
    assert_eq!(ms(Duration::from_micros(1500)), 2);
    assert_eq!(ms(Duration::from_nanos(1_000_001)), 2);
    assert_eq!(ms(Duration::from_millis(1)), 1);
    assert_eq!(ms(Duration::from_millis(30_000)), 30_000);
    assert_eq!(ms(Duration::ZERO), 1);
    assert_eq!(ms(Duration::MAX), u64::MAX);
}

#[test]
fn crc16_matches_redis_reference_value() {
    // From the Redis Cluster specification: CRC16 of "123456789" is 0x31C3.
    assert_eq!(crc16(b"123456789"), 0x31C3);
}

#[test]
fn sibling_keys_share_the_lock_keys_slot() {
    for key in [
        "lock:voucher:42",
        "lock:{user}:1",
        "lock:a}b",
        "lock:{}x}",
        "lock:ünï cødé/1",
    ] {
        let sib = sibling_key(key, "fence");
        assert_eq!(
            hash_slot(key.as_bytes()),
            hash_slot(sib.as_bytes()),
            "{key} vs {sib}"
        );
        assert!(
            !sib.starts_with("lock:"),
            "{sib} could collide with a lock key"
        );
    }
}
