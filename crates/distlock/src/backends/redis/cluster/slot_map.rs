//! The slot map a cluster gives with `CLUSTER SLOTS`, and where a command goes: its routing
//! key, and the redirection or retry an error reply asks for.

use std::collections::HashMap;

use super::Reply;

/// Hash slots of Redis Cluster.
pub(super) const SLOTS: usize = 16384;
/// A slot no master serves.
pub(super) const UNSERVED: u16 = u16::MAX;

/// The slot map: which master serves each slot, and its replicas.
pub(super) struct Topology {
    /// Slot → index into `masters`, [`UNSERVED`] when none serves it.
    pub(super) slots: Vec<u16>,
    pub(super) masters: Vec<Shard>,
    /// Node address → node id, of every node the map names with its id.
    pub(super) ids: HashMap<String, String>,
}

pub(super) struct Shard {
    pub(super) addr: String,
    pub(super) replicas: Vec<String>,
}

impl Topology {
    pub(super) fn empty() -> Self {
        Topology {
            slots: vec![UNSERVED; SLOTS],
            masters: Vec::new(),
            ids: HashMap::new(),
        }
    }

    pub(super) fn master_index(&mut self, addr: &str) -> u16 {
        match self.masters.iter().position(|m| m.addr == addr) {
            Some(i) => i as u16,
            None => {
                self.masters.push(Shard {
                    addr: addr.to_owned(),
                    replicas: Vec::new(),
                });
                (self.masters.len() - 1) as u16
            }
        }
    }

    /// Parses a `CLUSTER SLOTS` reply; `answering` is the node that sent it, whose address
    /// stands in for an empty one (a node that does not know its own address).
    pub(super) fn parse(reply: &Reply, answering: &str) -> Option<Topology> {
        let Reply::Array(Some(ranges)) = reply else {
            return None;
        };
        let mut t = Topology::empty();
        for range in ranges {
            let Reply::Array(Some(parts)) = range else {
                return None;
            };
            let (start, end) = (parts.first()?.int()?, parts.get(1)?.int()?);
            let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
            if start > end || end >= SLOTS {
                return None;
            }
            let mut nodes = parts[2..].iter().filter_map(|n| {
                let (addr, id) = node_addr(n, answering)?;
                if let Some(id) = id {
                    t.ids.insert(addr.clone(), id);
                }
                Some(addr)
            });
            let Some(master) = nodes.next() else {
                continue;
            };
            let nodes: Vec<String> = nodes.collect();
            let i = t.master_index(&master);
            for replica in nodes {
                let replicas = &mut t.masters[usize::from(i)].replicas;
                if !replicas.contains(&replica) {
                    replicas.push(replica);
                }
            }
            t.slots[start..=end].fill(i);
        }
        Some(t)
    }

    pub(super) fn served(&self) -> usize {
        self.slots.iter().filter(|s| **s != UNSERVED).count()
    }
}

/// `host:port` and the id (when given) of one node entry of `CLUSTER SLOTS`
/// (`[ip, port, id, …]`).
fn node_addr(node: &Reply, answering: &str) -> Option<(String, Option<String>)> {
    let Reply::Array(Some(f)) = node else {
        return None;
    };
    let host = match f.first()? {
        Reply::Bulk(Some(h)) => String::from_utf8_lossy(h).into_owned(),
        _ => return None,
    };
    let port = f.get(1)?.int()?;
    // "?" is a node whose preferred endpoint is unknown: not reachable by this client.
    if host == "?" || port <= 0 {
        return None;
    }
    let id = match f.get(2) {
        Some(Reply::Bulk(Some(id))) if !id.is_empty() => {
            Some(String::from_utf8_lossy(id).into_owned())
        }
        _ => None,
    };
    Some((join_host(&host, port, answering), id))
}

/// `host:port`, with the host of `answering` when `host` is empty, and IPv6 in brackets.
fn join_host(host: &str, port: i64, answering: &str) -> String {
    let host = if host.is_empty() {
        answering
            .rsplit_once(':')
            .map_or(answering, |(h, _)| h)
            .to_owned()
    } else if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    format!("{host}:{port}")
}

/// Where the next part of a request goes.
#[derive(Clone)]
pub(super) enum Route {
    /// To the master of the request's slot in the slot map.
    Owner,
    /// To this node, as the last `MOVED` said.
    Node(String),
    /// The next command only, to this node after `ASKING`.
    Ask(String),
}

/// A redirection or a retry the server asked for in an error reply.
pub(super) enum Redirect {
    Moved(usize, String),
    Ask(String),
    TryAgain,
}

pub(super) fn redirect(reply: &Reply, from: &str) -> Option<Redirect> {
    let Reply::Error(e) = reply else {
        return None;
    };
    if e.starts_with("TRYAGAIN") {
        return Some(Redirect::TryAgain);
    }
    let mut words = e.split_ascii_whitespace();
    let kind = words.next()?;
    let slot: usize = words.next()?.parse().ok().filter(|s| *s < SLOTS)?;
    let (host, port) = words.next()?.rsplit_once(':')?;
    let addr = join_host(host.trim_matches(['[', ']']), port.parse().ok()?, from);
    match kind {
        "MOVED" => Some(Redirect::Moved(slot, addr)),
        "ASK" => Some(Redirect::Ask(addr)),
        _ => None,
    }
}

/// The key a command is routed by: none for commands without keys.
pub(super) fn command_key<'a>(cmd: &[&'a [u8]]) -> Option<&'a [u8]> {
    let verb = cmd.first()?;
    if verb.eq_ignore_ascii_case(b"EVALSHA") || verb.eq_ignore_ascii_case(b"EVAL") {
        let n: usize = std::str::from_utf8(cmd.get(2)?).ok()?.parse().ok()?;
        return if n == 0 { None } else { cmd.get(3).copied() };
    }
    const KEYLESS: [&[u8]; 7] = [
        b"PING", b"INFO", b"WAIT", b"CLUSTER", b"ASKING", b"ROLE", b"TIME",
    ];
    if KEYLESS.iter().any(|k| verb.eq_ignore_ascii_case(k)) {
        return None;
    }
    cmd.get(1).copied()
}

#[cfg(test)]
#[path = "slot_map_tests.rs"]
mod tests;
