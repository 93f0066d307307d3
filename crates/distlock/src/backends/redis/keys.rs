//! Key names for Redis Cluster: the hash slot of a key and the sibling keys (queue, expiries)
//! that share the lock key's slot, so scripts touching both run on one node.

/// Redis Cluster's hash slot of a key (CRC16/XMODEM of the hash tag, or of the whole key).
pub(super) fn hash_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % 16384
}

pub(super) fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = key[open + 1..].iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

pub(super) fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A key for `kind` bookkeeping that lives in the same hash slot as `lock_key` (so scripts
/// touching both work on Redis Cluster) and cannot collide with a `<prefix>:<key>` lock key.
pub(super) fn sibling_key(lock_key: &str, kind: &str) -> String {
    let join = |tag: &str, with_key: bool| {
        let mut k = String::with_capacity(tag.len() + kind.len() + lock_key.len() + 4);
        k.push('{');
        k.push_str(tag);
        k.push_str("}:");
        k.push_str(kind);
        if with_key {
            k.push(':');
            k.push_str(lock_key);
        }
        k
    };
    if let Some(tag) = hash_tag(lock_key.as_bytes()) {
        // '{' and '}' are ASCII, so the tag is a valid slice of the key.
        let start = lock_key.find('{').map_or(0, |i| i + 1);
        return join(&lock_key[start..start + tag.len()], true);
    }
    if !lock_key.contains('}') {
        return join(lock_key, false);
    }
    // A key with a stray '}' and no hash tag: find a short tag that hashes to the same slot.
    let slot = hash_slot(lock_key.as_bytes());
    let alphabet = b"0123456789abcdefghijklmnopqrstuvwxyz";
    for a in alphabet {
        for b in alphabet {
            for c in alphabet {
                let tag = [*a, *b, *c];
                if crc16(&tag) % 16384 == slot {
                    return join(std::str::from_utf8(&tag).unwrap_or("0"), true);
                }
            }
        }
    }
    join(&slot.to_string(), true) // unreachable in practice: 46 656 tags cover all slots
}

/// Where Redisson starts the names that go with a read-write lock at `lock_key`: `{<lock
/// key>}`, or the lock key itself when it contains a `{` (Redisson's `suffixName` and
/// `prefixName` rule). Reader timeout keys are `<this>:<holder>:rwlock_timeout:<n>` and the
/// lock's channel is `redisson_rwlock:<this>`. Only with the braces do they share the lock key's
/// hash slot; a key with a `{` but no hash tag does not (as with Redisson itself).
pub(super) fn redisson_prefix(lock_key: &str) -> String {
    if lock_key.contains('{') {
        lock_key.to_owned()
    } else {
        let mut p = String::with_capacity(lock_key.len() + 2);
        p.push('{');
        p.push_str(lock_key);
        p.push('}');
        p
    }
}

/// Where the reader timeout keys of the read-write lock at `lock_key` start: Redisson's
/// [`redisson_prefix`], except on Redis Cluster (`cluster`) when that prefix would not put them
/// in the lock key's hash slot (a lock key with a `}` but no `{`, or with a `{` but no hash
/// tag), where a script could not touch them: there, a sibling name in the slot,
/// `{<tag>}:rwlock:<lock key>`. Redisson itself cannot take such keys on a Cluster (its script
/// would be refused as cross-slot), so no interoperation is lost.
pub(super) fn reader_prefix(lock_key: &str, cluster: bool) -> String {
    let prefix = redisson_prefix(lock_key);
    if !cluster
        || (hash_tag(prefix.as_bytes()).is_some()
            && hash_slot(prefix.as_bytes()) == hash_slot(lock_key.as_bytes()))
    {
        return prefix;
    }
    sibling_key(lock_key, "rwlock")
}

/// Whether `key` (found under `<prefix>:`) is bookkeeping that goes with some lock key
/// rather than a lock key: a Redisson reader timeout key (`...:rwlock_timeout:<n>`, named
/// after a lock key with a `{`), or one of our sibling keys, which match `<prefix>:*` only
/// when the prefix is itself a hash tag (`{<tag>}:fence:<lock key>`).
pub(super) fn is_bookkeeping(key: &str, prefix: &str) -> bool {
    if let Some((_, n)) = key.rsplit_once(":rwlock_timeout:") {
        if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            return true;
        }
    }
    let Some(rest) = key.strip_prefix('{').and_then(|k| k.split_once("}:")) else {
        return false;
    };
    SIBLINGS.iter().any(|kind| {
        rest.1 == *kind
            || rest
                .1
                .strip_prefix(kind)
                .and_then(|r| r.strip_prefix(':'))
                .is_some_and(|lock| lock.starts_with(prefix) || lock.starts_with('{'))
    })
}

/// The kinds of [`sibling_key`] the backend makes (`owners`: the holders' descriptions).
pub(super) const SIBLINGS: [&str; 4] = ["fence", "queue", "waiters", "owners"];
