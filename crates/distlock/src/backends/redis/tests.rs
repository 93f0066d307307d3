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

#[test]
fn reader_timeout_keys_share_the_lock_keys_slot_on_cluster() {
    use super::keys::{reader_prefix, redisson_prefix};
    for key in [
        "lock:voucher:42",
        "lock:{user}:1",
        "lock:a}b",
        "lock:{}x}",
        "lock:x{y",
        "lock:{}",
        "lock:ünï cødé/1",
    ] {
        // One node: Redisson's names, whatever they hash to.
        assert_eq!(reader_prefix(key, false), redisson_prefix(key));
        let prefix = reader_prefix(key, true);
        for field in ["0123456789abcdef0123456789abcdef", "uuid-1:17"] {
            let ttl = format!("{prefix}:{field}:rwlock_timeout:1");
            assert_eq!(
                hash_slot(key.as_bytes()),
                hash_slot(ttl.as_bytes()),
                "{key} vs {ttl}"
            );
            assert!(ttl.ends_with(":rwlock_timeout:1"));
        }
        assert_eq!(
            hash_slot(key.as_bytes()),
            hash_slot(prefix.as_bytes()),
            "{key} vs {prefix}"
        );
    }
    // Where Redisson's own names are in the slot, Cluster keeps them (Redisson interoperates).
    assert_eq!(reader_prefix("lock:job", true), "{lock:job}");
    assert_eq!(reader_prefix("lock:{user}:1", true), "lock:{user}:1");
}

#[test]
fn cluster_scripts_differ_from_single_node_ones_only_in_the_floored_fence() {
    use super::scripts::Scripts;
    let (one, cluster) = (Scripts::new(false), Scripts::new(true));
    let counter = "  if f < 1000000000000 then\n    local t = redis.call('TIME')\n    f = tonumber(t[1]) * 1000000 + tonumber(t[2])\n";
    let floored = "  local t = redis.call('TIME')\n  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n  if f < now then\n    f = now\n";
    let counter_now = "  return tonumber(redis.call('GET', KEYS[2]) or '0')\n";
    let floored_now = "  local t = redis.call('TIME')\n  return math.max(tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(t[1]) * 1000000 + tonumber(t[2]))\n";
    let pairs = [
        (&one.acquire, &cluster.acquire, true),
        (&one.release, &cluster.release, true),
        (&one.release_alone, &cluster.release_alone, false),
        (&one.force_release, &cluster.force_release, true),
        (&one.leave, &cluster.leave, true),
        (&one.inspect, &cluster.inspect, true),
        (&one.kind_acquire, &cluster.kind_acquire, true),
        (&one.kind_release, &cluster.kind_release, true),
        (&one.extend, &cluster.extend, false),
        (&one.extend_many, &cluster.extend_many, false),
        (&one.kind_extend, &cluster.kind_extend, false),
        (&one.take, &cluster.take, true),
        (&one.fence_held, &cluster.fence_held, true),
    ];
    for (single, on_cluster, fenced) in pairs {
        if fenced {
            assert_eq!(single.body.matches(counter).count(), 1, "{}", single.body);
            assert_eq!(
                single.body.matches(counter_now).count(),
                1,
                "{}",
                single.body
            );
            assert_eq!(
                on_cluster.body,
                single
                    .body
                    .replacen(counter, floored, 1)
                    .replacen(counter_now, floored_now, 1)
            );
            assert!(!single.body.contains("local now ="));
        } else {
            assert_eq!(single.body, on_cluster.body);
        }
    }
}

/// A caller that takes its own instance's reservation, by `ACQUIRE` or `TAKE`, leaves the wait
/// queue its earlier busy attempt put it in: a place left behind would later be handed the
/// lock of a hold that has ended, and keep the key from everybody for that grant.
#[test]
fn taking_its_own_reservation_leaves_the_queue() {
    use super::scripts::Scripts;
    let server = distlock_testkit::redis::RedisServer::start().expect("redis-server");
    let scripts = Scripts::new(false);
    let (instance, token) = ("00000000000000ab", "a".repeat(32));
    let member = format!("{token}:{instance}");
    let reservation = format!("~{instance}:2000");
    let (lock, fence) = ("lock:own", sibling_key("lock:own", "fence"));
    let (queue, waiters) = (
        sibling_key("lock:own", "queue"),
        sibling_key("lock:own", "waiters"),
    );
    let owners = sibling_key("lock:own", "owners");
    let far = "99999999999999:30000";
    let acquire = [token.as_str(), "30000", "2000", &member, "me:1"];
    let take = [reservation.as_str(), &token, "30000", &member, "me:1"];
    for (script, args) in [(&scripts.acquire, acquire), (&scripts.take, take)] {
        server.cli(&["ZADD", &queue, "1", &member]).unwrap();
        server.cli(&["HSET", &waiters, &member, far]).unwrap();
        server
            .cli(&["SET", lock, &reservation, "PX", "5000"])
            .unwrap();
        let mut cmd = vec![
            "EVAL",
            script.body.as_str(),
            "5",
            lock,
            &fence,
            &queue,
            &waiters,
            &owners,
        ];
        cmd.extend(args);
        let reply = server.cli(&cmd).unwrap();
        assert!(reply.starts_with("1\n"), "taken: {reply:?}");
        assert_eq!(server.cli(&["GET", lock]).unwrap(), token);
        assert_eq!(server.cli(&["ZCARD", &queue]).unwrap(), "0", "still queued");
        assert_eq!(server.cli(&["HLEN", &waiters]).unwrap(), "0");
        assert_eq!(server.cli(&["HGET", &owners, &token]).unwrap(), "me:1");
        server.cli(&["DEL", lock]).unwrap();
    }
}

#[test]
fn max_connections_is_a_number_from_1_to_the_bound_on_redis_urls_only() {
    use super::transport::parse_max_connections;
    use super::MAX_CONNECTIONS;
    use crate::Error;
    use futures_util::FutureExt;

    let base = "redis://127.0.0.1:6379";
    assert_eq!(parse_max_connections(base, "1").unwrap(), 1);
    assert_eq!(parse_max_connections(base, "4").unwrap(), 4);
    assert_eq!(
        parse_max_connections("REDIS://h", &MAX_CONNECTIONS.to_string()).unwrap(),
        MAX_CONNECTIONS
    );
    let refused = |url: &str| match crate::connect(url).now_or_never() {
        Some(Err(Error::InvalidConfig(m))) => m,
        Some(Err(e)) => panic!("{url}: {e:?}"),
        Some(Ok(_)) => panic!("{url}: connected"),
        None => panic!("{url}: did not answer at once"),
    };
    for bad in ["0", "-1", "1025", "x", "", "99999999999999999999999"] {
        let m = refused(&format!("{base}?max_connections={bad}"));
        assert!(
            m.contains("max_connections") && m.contains("1024"),
            "{bad}: {m}"
        );
    }
    let m = refused("rediss://127.0.0.1:6379?max_connections=4");
    assert!(m.contains("only redis://"), "{m}");
    // Set in code, the same bounds.
    for n in [0, MAX_CONNECTIONS + 1] {
        let options = super::RedisOptions {
            max_connections: n,
            ..Default::default()
        };
        match super::RedisBackend::build(base, options) {
            Err(Error::InvalidConfig(m)) => assert!(m.contains("max_connections"), "{m}"),
            other => panic!("{n}: {:?}", other.err()),
        }
    }
}
