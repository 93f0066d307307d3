//! The lock kinds in one lock directory `<prefix>/<key>/`, in the layout the backend's module
//! documentation gives: the key and value each kind writes, what any key there stands for,
//! and when a reader or permit holds. The owner description is written with `%` and `;`
//! escaped so that the first `;permits=` of a value is the number's: older distlock versions,
//! which wrote no description, look for that and read the number after it.

use crate::backend::{LockKind, Owner, Token, UNKNOWN_OWNER};
use crate::backends::contenders;

use super::pb;
use super::watch::WatchTarget;

const READ_TAG: &[u8] = b"read-";
const WRITE_TAG: &[u8] = b"write-";
const PERMIT_TAG: &[u8] = b"sem-";
const PERMITS_VALUE: &[u8] = b";permits=";
const OWNER_VALUE: &[u8] = b";owner=";
/// Hex digits of the owner token at the front of every value distlock writes.
const TOKEN_LEN: usize = 32;

/// The key of a hold of `kind` in `dir` on session lease `lease_id`: the mutex's as
/// `concurrency.Mutex` names it (`<dir><lease id>`), the other kinds' behind a tag. A name per
/// session and directory, not per hold: a session holds one key of a directory at a time (see
/// `Shared::session_of_class`), and the next hold reuses the name. Naming each hold after its token
/// made every hold a new key, and etcd keeps a deleted key in its index until a compaction:
/// read cycles slowed as they piled up (1,043 down to 665 cycles/s over 10,000 cycles, the
/// mutex steady at 1,300).
pub(super) fn key_of(kind: LockKind, dir: &str, lease_id: i64) -> String {
    let tag = match kind {
        LockKind::Read => "read-",
        LockKind::Write => "write-",
        LockKind::Semaphore { .. } => "sem-",
        _ => "",
    };
    format!("{dir}{tag}{lease_id:x}")
}

/// The value `token`'s key of `kind` holds for `owner` (renewals and releases compare it).
pub(super) fn value_of(kind: LockKind, token: Token, owner: &str) -> Vec<u8> {
    let mut v = token.to_hex_bytes().to_vec();
    v.extend_from_slice(OWNER_VALUE);
    for b in owner.bytes() {
        match b {
            b'%' => v.extend_from_slice(b"%25"),
            b';' => v.extend_from_slice(b"%3B"),
            b => v.push(b),
        }
    }
    if let LockKind::Semaphore { permits } = kind {
        v.extend_from_slice(PERMITS_VALUE);
        v.extend_from_slice(permits.to_string().as_bytes());
    }
    v
}

/// Who holds a key whose value is `value`: the description distlock wrote, unknown for a
/// value of an older distlock (its token alone, or with the permits), else the value itself
/// (a foreign client's; `etcdctl lock`'s is empty, so unknown).
pub(super) fn owner_of(value: &[u8]) -> String {
    let ours = value.len() >= TOKEN_LEN
        && value[..TOKEN_LEN].iter().all(u8::is_ascii_hexdigit)
        && (value.len() == TOKEN_LEN || value[TOKEN_LEN] == b';');
    if !ours {
        return Owner::shown(value);
    }
    let Some(rest) = value[TOKEN_LEN..].strip_prefix(OWNER_VALUE) else {
        return UNKNOWN_OWNER.to_owned();
    };
    let end = rest.iter().position(|b| *b == b';').unwrap_or(rest.len());
    let mut out = Vec::with_capacity(end);
    let mut i = 0;
    while i < end {
        match &rest[i..end] {
            [b'%', b'2', b'5', ..] => (out.push(b'%'), i += 3),
            [b'%', b'3', b'B', ..] => (out.push(b';'), i += 3),
            [b, ..] => (out.push(*b), i += 1),
            [] => break,
        };
    }
    Owner::shown(&out)
}

/// What the key `name` (relative to its directory) with `value` stands for. A permit whose
/// number cannot be read has 0 permits.
pub(super) fn kind_of(name: &[u8], value: &[u8]) -> LockKind {
    if name.starts_with(READ_TAG) {
        LockKind::Read
    } else if name.starts_with(WRITE_TAG) {
        LockKind::Write
    } else if name.starts_with(PERMIT_TAG) {
        LockKind::Semaphore {
            permits: permits_of(value).unwrap_or(0),
        }
    } else {
        LockKind::Mutex
    }
}

fn permits_of(value: &[u8]) -> Option<u32> {
    let at = value
        .windows(PERMITS_VALUE.len())
        .position(|w| w == PERMITS_VALUE)?;
    std::str::from_utf8(&value[at + PERMITS_VALUE.len()..])
        .ok()?
        .parse()
        .ok()
}

/// Whether `key` is a key of the directory `dir` itself, not of a lock whose key extends the
/// directory's with `/`.
pub(super) fn is_direct_child(dir: &[u8], key: &[u8]) -> bool {
    key.len() > dir.len() && key.starts_with(dir) && !key[dir.len()..].contains(&b'/')
}

/// One key of a lock directory: its fence is its create revision.
pub(super) type Queued = contenders::Queued<Key>;

/// A key of a lock directory, and the lease it is attached to (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    pub(super) key: Vec<u8>,
    pub(super) lease: i64,
}

/// `f` of each direct child of `dir` among `kvs`, in the order given.
pub(super) fn children<'a, T>(
    dir: &[u8],
    kvs: &'a [pb::KeyValue],
    f: impl FnMut(&'a pb::KeyValue) -> T,
) -> Vec<T> {
    kvs.iter()
        .filter(|kv| is_direct_child(dir, &kv.key))
        .map(f)
        .collect()
}

/// The direct children of `dir` among `kvs`, in the order given; as the candidates of the
/// election `dir` (`concurrency.Election`) when `election`: each one a contender for the one
/// leadership, its value the candidate's description as it is.
pub(super) fn queued(dir: &[u8], kvs: &[pb::KeyValue], election: bool) -> Vec<Queued> {
    children(dir, kvs, |kv| {
        let (kind, owner) = match election {
            true => (LockKind::Mutex, Owner::shown(&kv.value)),
            false => (
                kind_of(&kv.key[dir.len()..], &kv.value),
                owner_of(&kv.value),
            ),
        };
        Queued {
            kind,
            fence: kv.create_revision,
            owner,
            entry: Key {
                key: kv.key.clone(),
                lease: kv.lease,
            },
        }
    })
}

/// The keys of `dir` for the permits of its semaphore, as a watched range.
pub(super) fn permits_range(dir: &str) -> WatchTarget {
    let mut key = dir.as_bytes().to_vec();
    key.extend_from_slice(PERMIT_TAG);
    WatchTarget {
        range_end: pb::prefix_end(&key),
        key,
        rev: 0,
    }
}

/// What one look at the queue says of a contender's key.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Holds,
    /// It waits; the registry is woken when the target goes (or, for a range, when a key in
    /// it goes).
    Waits(WatchTarget),
    /// A permit of the same semaphore was taken with this other number of permits.
    Disagrees(u32),
    /// Its own key is not in the queue (it just went).
    Gone,
    /// Somebody older holds, but the ranges raced with a change: look again.
    Unclear,
}

/// The verdict for a reader or permit (`kind`) of `dir` whose older keys are `before` (oldest
/// first, complete): a permit behind as many permits as it has waits for any of them to go.
pub(super) fn judge(kind: LockKind, dir: &str, before: &[Queued]) -> Verdict {
    match contenders::verdict(kind, before.iter().map(|q| (q.kind, q))) {
        contenders::Verdict::Holds => Verdict::Holds,
        contenders::Verdict::Behind(q) => {
            Verdict::Waits(WatchTarget::key(q.entry.key.clone(), q.fence))
        }
        contenders::Verdict::Full { .. } => Verdict::Waits(permits_range(dir)),
        contenders::Verdict::Disagrees(p) => Verdict::Disagrees(p),
    }
}

/// The verdict for a mutex or writer whose key was created at `rev`, from every key of its
/// directory (`all`, oldest first): it holds when its key is the oldest, else it waits for
/// the key created just before its own.
pub(super) fn judge_exclusive(all: Vec<WatchTarget>, rev: i64) -> Verdict {
    match all.first() {
        None => Verdict::Gone,
        Some(h) if h.rev == rev => Verdict::Holds,
        Some(_) => match all.into_iter().take_while(|c| c.rev < rev).last() {
            Some(pred) => Verdict::Waits(pred),
            None => Verdict::Unclear,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, rev: i64, kind: LockKind) -> Queued {
        Queued {
            kind,
            fence: rev,
            owner: UNKNOWN_OWNER.to_owned(),
            entry: Key {
                key: format!("p/k/{name}").into_bytes(),
                lease: 0,
            },
        }
    }

    #[test]
    fn keys_and_values_tell_the_kinds_apart() {
        let t = Token::from(0xabcu128);
        let sem = LockKind::Semaphore { permits: 3 };
        for kind in [LockKind::Mutex, LockKind::Read, LockKind::Write, sem] {
            let key = key_of(kind, "p/k/", 0x1f);
            let name = &key.as_bytes()["p/k/".len()..];
            let value = value_of(kind, t, "web;1:100%");
            assert_eq!(kind_of(name, &value), kind, "{key}");
            assert_eq!(owner_of(&value), "web;1:100%", "{key}");
        }
        assert_eq!(key_of(LockKind::Mutex, "p/k/", 0x1f), "p/k/1f");
        assert_eq!(key_of(LockKind::Read, "p/k/", 0x1f), "p/k/read-1f");
        // etcdctl's keys (a lease id, value "") are mutexes; a permit without a number has 0.
        assert_eq!(kind_of(b"694d7a1b2c3d4e5f", b""), LockKind::Mutex);
        assert_eq!(
            kind_of(b"sem-x", b"junk"),
            LockKind::Semaphore { permits: 0 }
        );
    }

    #[test]
    fn owners_are_read_from_values_old_and_foreign() {
        let t = Token::from(0xabcu128);
        let sem = LockKind::Semaphore { permits: 3 };
        // A description that looks like the number of permits does not hide the real one.
        let sly = value_of(sem, t, "x;permits=9");
        assert_eq!(kind_of(b"sem-1f", &sly), sem);
        assert_eq!(owner_of(&sly), "x;permits=9");
        // Values of older versions: the token alone, or with the permits.
        let token = t.to_hex_bytes().to_vec();
        assert_eq!(owner_of(&token), UNKNOWN_OWNER);
        let mut old_permit = token.clone();
        old_permit.extend_from_slice(b";permits=3");
        assert_eq!(owner_of(&old_permit), UNKNOWN_OWNER);
        // Foreign values: `etcdctl lock`'s empty one, an election's proposal.
        assert_eq!(owner_of(b""), UNKNOWN_OWNER);
        assert_eq!(owner_of(b"leader-7"), "leader-7");
        assert_eq!(owner_of(b"a\x00b"), "a b");
    }

    #[test]
    fn readers_wait_for_older_exclusive_keys_only() {
        let read = LockKind::Read;
        assert_eq!(judge(read, "p/k/", &[]), Verdict::Holds);
        let before = [
            q("read-a", 1, read),
            q("694d", 2, LockKind::Mutex),
            q("read-b", 3, read),
        ];
        assert_eq!(
            judge(read, "p/k/", &before),
            Verdict::Waits(WatchTarget::key(b"p/k/694d".to_vec(), 2))
        );
        assert_eq!(judge(read, "p/k/", &before[..1]), Verdict::Holds);
    }

    #[test]
    fn permits_count_and_agree() {
        let sem = LockKind::Semaphore { permits: 2 };
        let one = [q("sem-a", 1, sem)];
        assert_eq!(judge(sem, "p/k/", &one), Verdict::Holds);
        let two = [q("sem-a", 1, sem), q("sem-b", 2, sem)];
        assert_eq!(
            judge(sem, "p/k/", &two),
            Verdict::Waits(permits_range("p/k/"))
        );
        let reader = [q("read-a", 1, LockKind::Read)];
        assert!(matches!(judge(sem, "p/k/", &reader), Verdict::Waits(t) if t.rev == 1));
        let other = [q("sem-a", 1, LockKind::Semaphore { permits: 3 })];
        assert_eq!(judge(sem, "p/k/", &other), Verdict::Disagrees(3));
    }
}
