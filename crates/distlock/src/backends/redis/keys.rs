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
