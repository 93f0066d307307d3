//! The queue of a key's contenders: Curator's node names, the one order they share and each
//! contender's place in it. Creating the nodes is in `contender.rs`, an attempt in `attempt.rs`,
//! watching in `watch.rs`, deleting them in `reap.rs`.
//! The names and the order are the module documentation's (lock kinds on one key).

use super::*;
use crate::backends::contenders;

/// The token as a UUID (8-4-4-4-12 hex digits), the `<uuid>` of Curator's protected names.
pub(super) fn uuid_of(token: Token) -> String {
    let v = token.as_u128();
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (v >> 96) as u32,
        (v >> 80) as u16,
        (v >> 64) as u16,
        (v >> 48) as u16,
        v & 0xffff_ffff_ffff
    )
}

/// `_c_<uuid>-`: the start of every node name of `token`.
pub(super) fn protected_prefix(token: Token) -> String {
    format!("{PROTECTED}{}-", uuid_of(token))
}

/// What a contender node under a key's node is, by the name Curator gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// `lock-`: Curator's `InterProcessMutex`, Spring's registry, distlock's mutex.
    Mutex,
    /// `__READ__`: a reader of Curator's `InterProcessReadWriteLock`.
    Read,
    /// `__WRIT__`: its writer.
    Write,
    /// `latch-`: a candidate of Curator's `LeaderLatch` (a distlock election's). A recipe of
    /// its own: the other roles ignore it, and it ignores them.
    Latch,
}

impl Role {
    pub(super) fn of(kind: LockKind) -> Role {
        match kind {
            LockKind::Read => Role::Read,
            LockKind::Write => Role::Write,
            _ => Role::Mutex,
        }
    }

    pub(super) fn marker(self) -> &'static str {
        match self {
            Role::Mutex => LOCK_NAME,
            Role::Read => READ_NAME,
            Role::Write => WRITE_NAME,
            Role::Latch => LATCH_NAME,
        }
    }

    pub(super) fn kind(self) -> LockKind {
        match self {
            Role::Mutex | Role::Latch => LockKind::Mutex,
            Role::Read => LockKind::Read,
            Role::Write => LockKind::Write,
        }
    }

    /// Curator's readers take any name with `__WRIT__` for a writer, so that decides first.
    fn of_name(child: &str) -> Option<Role> {
        if child.contains(WRITE_NAME) {
            Some(Role::Write)
        } else if child.contains(READ_NAME) {
            Some(Role::Read)
        } else if child.contains(LOCK_NAME) {
            Some(Role::Mutex)
        } else {
            None
        }
    }
}

/// One contender node under a key's node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Contender<'a> {
    pub(super) seq: i64,
    pub(super) role: Role,
    pub(super) name: &'a str,
}

/// The sequence number after the last `marker` in `child` (Curator's `fixForSorting`).
pub(super) fn sequence_after(child: &str, marker: &str) -> Option<i64> {
    let i = child.rfind(marker)?;
    let digits = &child[i + marker.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn contender(child: &str, role: Option<Role>) -> Option<Contender<'_>> {
    let role = role.or_else(|| Role::of_name(child))?;
    Some(Contender {
        seq: sequence_after(child, role.marker())?,
        role,
        name: child,
    })
}

/// The contenders of `role`'s recipe among a key's children, in queue order (lowest sequence
/// first, ties by name). A `LeaderLatch` candidate counts only the other `latch-` nodes, as
/// `LeaderLatch` sorts the others after its own; the other roles count mutexes, readers and
/// writers, and ignore the rest (a semaphore's folders, foreign nodes).
pub(super) fn sort_for(role: Role, children: &[String]) -> Vec<Contender<'_>> {
    let only = (role == Role::Latch).then_some(Role::Latch);
    let mut v: Vec<Contender<'_>> = children.iter().filter_map(|c| contender(c, only)).collect();
    v.sort_unstable_by(|a, b| (a.seq, a.name).cmp(&(b.seq, b.name)));
    v
}

/// A key's mutexes, readers and writers in queue order (see [`sort_for`]).
pub(super) fn sort_contenders(children: &[String]) -> Vec<Contender<'_>> {
    sort_for(Role::Mutex, children)
}

/// Lease nodes in creation order (every child of a `leases` folder counts, as in Curator).
pub(super) fn sort_leases(children: &[String]) -> Vec<&str> {
    let mut v: Vec<(i64, &str)> = children
        .iter()
        .map(|c| (sequence_after(c, LEASE_NAME).unwrap_or(-1), c.as_str()))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, c)| c).collect()
}

/// Where a contender stands in its key's queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Place<'a> {
    /// Its node is not among the children (deleted underneath, or its session ended).
    Gone,
    /// Nothing before it excludes it.
    First,
    /// It waits for this contender (the nearest one before it that excludes it).
    Behind(&'a str),
}

/// The place of `own`: an exclusive contender waits for every contender before it, a reader
/// for the exclusive ones before it. A tie (a non-sequential node that copied another's
/// sequence, as Curator 5.5's downgrade does) counts as before.
pub(super) fn place<'a>(sorted: &[Contender<'a>], own: &str) -> Place<'a> {
    let Some(me) = sorted.iter().find(|c| c.name == own) else {
        return Place::Gone;
    };
    let before = sorted
        .iter()
        .filter(|c| c.name != own && c.seq <= me.seq)
        .map(|c| (c.role.kind(), c.name));
    match contenders::verdict(me.role.kind(), before) {
        contenders::Verdict::Behind(name) => Place::Behind(name),
        // Mutexes, readers and writers have no permits to count or disagree on.
        _ => Place::First,
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
