//! A Redis Cluster on loopback: masters and their replicas, each a [`RedisServer`] of its own,
//! for tests of slot routing, failover and slot migration.
//!
//! The cluster is put together with the cluster commands themselves (`ADDSLOTSRANGE`,
//! `SET-CONFIG-EPOCH`, `MEET`, `REPLICATE`), as `redis-cli --cluster create` does, but without
//! its fixed one-second waits: every step polls for the state it needs.

use std::io;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use super::{RedisServer, RedisServerOptions};

/// `cluster-node-timeout` of every node: how long a node may be silent before the others
/// suspect it, so roughly how long a failover after a `kill -9` takes to begin. Two seconds
/// keeps failover tests short without letting a loaded machine's scheduling delays look like
/// a dead node.
pub const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long any one state of the cluster may take to come about: generous, because a loaded
/// 2-CPU machine runs the gossip late; the waits poll and end as soon as the state is there.
const SETTLE: Duration = Duration::from_secs(60);

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    port: u16,
    flags: Vec<String>,
    master: Option<String>,
    /// Slot ranges served, inclusive.
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn parse(line: &str) -> Option<NodeLine> {
        let mut f = line.split_whitespace();
        let id = f.next()?.to_owned();
        let addr = f.next()?;
        let port = addr
            .split(['@', ','])
            .next()?
            .rsplit_once(':')?
            .1
            .parse()
            .ok()?;
        let flags = f.next()?.split(',').map(str::to_owned).collect();
        let master = Some(f.next()?).filter(|m| *m != "-").map(str::to_owned);
        let mut f = f.skip(4); // ping-sent, pong-recv, config-epoch, link-state
        let mut slots = Vec::new();
        for s in f.by_ref() {
            if s.starts_with('[') {
                continue; // a migration in progress: [slot->-id] or [slot-<-id]
            }
            let (a, b) = s.split_once('-').unwrap_or((s, s));
            slots.push((a.parse().ok()?, b.parse().ok()?));
        }
        Some(NodeLine {
            id,
            port,
            flags,
            master,
            slots,
        })
    }

    fn is(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// A slot being moved from one master to another, step by step (see
/// [`ClusterSet::begin_migration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMigration {
    /// The hash slot.
    pub slot: u16,
    /// Index of the master it leaves.
    pub from: usize,
    /// Index of the master it goes to.
    pub to: usize,
}

/// Masters and replicas forming one Redis Cluster. Nodes are indexed from 0; the first
/// `masters` started as masters (slots split evenly, in order), the rest as replicas, replica
/// `masters + k` of master `k % masters`. Failovers change who is master: ask
/// [`master_of`](Self::master_of).
#[derive(Debug)]
pub struct ClusterSet {
    /// Every node.
    pub nodes: Vec<RedisServer>,
    ids: Vec<String>,
}

impl ClusterSet {
    /// Three masters with one replica each, the smallest cluster that survives losing a master.
    ///
    /// # Errors
    ///
    /// As for [`start_with`](Self::start_with).
    pub fn start() -> io::Result<ClusterSet> {
        Self::start_with(3, 1)
    }

    /// `masters` masters with `replicas` replicas each. Returns once every node serves, agrees
    /// on the whole slot map with every replica in it, and every replica is in sync.
    ///
    /// # Errors
    ///
    /// Fails if a server does not start or the cluster does not form within a minute.
    pub fn start_with(masters: usize, replicas: usize) -> io::Result<ClusterSet> {
        Self::start_nodes(masters, replicas, None)
    }

    /// As [`start_with`](Self::start_with), with every node also listening for TLS with the
    /// certificates in `tls` (see [`RedisServerOptions::tls`]), and replication and the
    /// cluster bus over TLS (`tls-cluster`); [`url`](Self::url) is then a `rediss+cluster://`
    /// URL of the TLS ports. The plain ports stay open for [`RedisServer::cli`], and the slot
    /// map a plain connection reads names them.
    ///
    /// # Errors
    ///
    /// As for [`start_with`](Self::start_with).
    pub fn start_tls(masters: usize, replicas: usize, tls: &Path) -> io::Result<ClusterSet> {
        Self::start_nodes(masters, replicas, Some(tls))
    }

    fn start_nodes(masters: usize, replicas: usize, tls: Option<&Path>) -> io::Result<ClusterSet> {
        if masters == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one master",
            ));
        }
        let total = masters * (1 + replicas);
        let nodes = (0..total)
            .map(|_| {
                RedisServer::start_with(RedisServerOptions {
                    cluster: true,
                    tls: tls.map(Path::to_path_buf),
                    ..Default::default()
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        let ids = nodes
            .iter()
            .map(|n| n.cli(&["CLUSTER", "MYID"]))
            .collect::<io::Result<Vec<_>>>()?;
        let mut set = ClusterSet { nodes, ids };
        for (i, node) in set.nodes.iter().enumerate() {
            // Distinct epochs up front, as `redis-cli --cluster create` sets them, so no
            // collision has to be resolved before the cluster is usable.
            node.cli(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()])?;
            if i < masters {
                let first = i * 16384 / masters;
                let last = (i + 1) * 16384 / masters - 1;
                node.cli(&[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ])?;
            }
        }
        for node in &set.nodes[1..] {
            // With `tls-cluster` the bus port is 10,000 above the TLS port.
            let port = node.data_port().to_string();
            set.nodes[0].cli(&["CLUSTER", "MEET", "127.0.0.1", &port])?;
        }
        set.wait_until("every node knows every other", |s| {
            s.nodes.iter().all(|n| {
                view(n).is_some_and(|v| {
                    v.len() == total && v.iter().all(|l| !l.is("handshake") && !l.is("noaddr"))
                })
            })
        })?;
        for r in masters..total {
            let master = &set.ids[(r - masters) % masters];
            set.nodes[r].cli(&["CLUSTER", "REPLICATE", master])?;
        }
        set.await_settled(replicas)?;
        Ok(set)
    }

    /// `redis+cluster://127.0.0.1:p0,127.0.0.1:p1,…`, every node a seed; with TLS
    /// `rediss+cluster://` and the TLS ports (add `?ca_file=` for the test CA).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.data_port()))
            .collect();
        let scheme = if self.nodes[0].tls_port().is_some() {
            "rediss+cluster"
        } else {
            "redis+cluster"
        };
        format!("{scheme}://{}", hosts.join(","))
    }

    /// The node id of node `i` (`CLUSTER MYID`).
    pub fn id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of a running node).
    ///
    /// # Errors
    ///
    /// When no node answers.
    pub fn slot_of(&mut self, key: &str) -> io::Result<u16> {
        let reply = self
            .running()
            .find_map(|n| n.cli(&["CLUSTER", "KEYSLOT", key]).ok())
            .ok_or_else(|| io::Error::other("no cluster node answers"))?;
        reply
            .parse()
            .map_err(|_| io::Error::other(format!("CLUSTER KEYSLOT answered {reply:?}")))
    }

    /// The index of the node that serves `slot` as master, as the running nodes see it
    /// (the first that answers and names a master that is not failing).
    pub fn master_of(&mut self, slot: u16) -> Option<usize> {
        let views: Vec<Vec<NodeLine>> = self.running().filter_map(view).collect();
        views.iter().find_map(|v| {
            let line = v
                .iter()
                .find(|l| l.is("master") && !l.is("fail") && l.serves(slot))?;
            self.index_of_port(line.port)
        })
    }

    /// The replicas of master `master` that the running nodes know.
    pub fn replicas_of(&mut self, master: usize) -> Vec<usize> {
        let id = self.ids[master].clone();
        let views: Vec<Vec<NodeLine>> = self.running().filter_map(view).collect();
        let mut out: Vec<usize> = views
            .iter()
            .flat_map(|v| v.iter())
            .filter(|l| l.master.as_deref() == Some(id.as_str()) && !l.is("fail"))
            .filter_map(|l| self.index_of_port(l.port))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// A manual failover of `master`'s shard: `CLUSTER FAILOVER` on one of its replicas, which
    /// waits for the replica to catch up with the master before it takes over, so nothing
    /// acknowledged is lost. Returns the new master's index once every running node agrees
    /// and the cluster serves every slot.
    ///
    /// # Errors
    ///
    /// Fails if the master has no replica or the new master is not in place within a minute.
    pub fn failover(&mut self, master: usize) -> io::Result<usize> {
        let replica = *self
            .replicas_of(master)
            .first()
            .ok_or_else(|| io::Error::other(format!("node {master} has no replica")))?;
        self.nodes[replica].cli(&["CLUSTER", "FAILOVER"])?;
        self.await_master(replica, master)?;
        Ok(replica)
    }

    /// Kills master `master` with `SIGKILL` and waits until the cluster has promoted one of
    /// its replicas and serves every slot again. Returns the new master's index. The killed
    /// node stays down: [`rejoin`](Self::rejoin) brings it back as a replica.
    ///
    /// # Errors
    ///
    /// Fails if the master has no replica or none is promoted within a minute.
    pub fn kill_master(&mut self, master: usize) -> io::Result<usize> {
        let replicas = self.replicas_of(master);
        if replicas.is_empty() {
            return Err(io::Error::other(format!("node {master} has no replica")));
        }
        let slot = self.served_slot(master)?;
        self.nodes[master].kill();
        let mut promoted = None;
        self.wait_until("a replica of the killed master is promoted", |s| {
            promoted = s.master_of(slot).filter(|m| replicas.contains(m));
            promoted.is_some_and(|p| s.agree_on_master(p))
        })?;
        let promoted = promoted.ok_or_else(|| io::Error::other("no replica was promoted"))?;
        self.await_state_ok()?;
        Ok(promoted)
    }

    /// Starts node `i` again, empty but with its `nodes.conf`, and waits until it follows
    /// `master` in sync (a master killed after its replica was promoted comes back as that
    /// replica's replica).
    ///
    /// # Errors
    ///
    /// Fails if it does not start or is not in sync within a minute.
    pub fn rejoin(&mut self, i: usize, master: usize) -> io::Result<()> {
        self.nodes[i].restart()?;
        let master_id = self.ids[master].clone();
        self.wait_until("the restarted node follows its new master", |s| {
            let ok = view(&s.nodes[i]).is_some_and(|v| {
                v.iter().any(|l| {
                    l.id == s.ids[i] && l.is("slave") && l.master.as_deref() == Some(&master_id)
                })
            });
            ok && s.nodes[master]
                .cli(&["INFO", "replication"])
                .is_ok_and(|r| r.contains(&format!("port={},state=online", s.nodes[i].data_port())))
        })?;
        self.await_state_ok()
    }

    /// Starts moving `slot` from its master to master `to`: `CLUSTER SETSLOT … IMPORTING` on
    /// the target, then `… MIGRATING` on the source. Keys stay where they are until
    /// [`move_keys`](Self::move_keys); meanwhile the source answers `ASK` for keys it lacks.
    ///
    /// # Errors
    ///
    /// When no master serves the slot, `to` is its master already, or a command fails.
    pub fn begin_migration(&mut self, slot: u16, to: usize) -> io::Result<SlotMigration> {
        let from = self
            .master_of(slot)
            .ok_or_else(|| io::Error::other(format!("no master serves slot {slot}")))?;
        if from == to {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} is on node {to} already"),
            ));
        }
        let s = slot.to_string();
        self.nodes[to].cli(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &self.ids[from]])?;
        self.nodes[from].cli(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &self.ids[to]])?;
        Ok(SlotMigration { slot, from, to })
    }

    /// Moves the keys of a migration's slot to the target, `keys` only when given (to stop
    /// half-way, with some keys on each side), else all of them (`GETKEYSINSLOT`). Each key
    /// moves with `MIGRATE`, which refuses to overwrite a key the target has.
    ///
    /// # Errors
    ///
    /// When a command fails.
    pub fn move_keys(&self, m: SlotMigration, keys: Option<&[&str]>) -> io::Result<()> {
        let source = &self.nodes[m.from];
        let found;
        let keys: Vec<&str> = match keys {
            Some(k) => k.to_vec(),
            None => {
                found = source.cli(&["CLUSTER", "GETKEYSINSLOT", &m.slot.to_string(), "10000"])?;
                found.lines().filter(|l| !l.is_empty()).collect()
            }
        };
        // With `tls-cluster`, MIGRATE goes over TLS.
        let port = self.nodes[m.to].data_port().to_string();
        for key in keys {
            let reply = source.cli(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"])?;
            if reply != "OK" && reply != "NOKEY" {
                return Err(io::Error::other(format!("MIGRATE {key}: {reply}")));
            }
        }
        Ok(())
    }

    /// Ends a migration: `CLUSTER SETSLOT … NODE <target>` on the target, the source and every
    /// other master, and waits until every running node routes the slot to the target.
    ///
    /// # Errors
    ///
    /// When a command fails or the nodes do not agree within a minute.
    pub fn finish_migration(&mut self, m: SlotMigration) -> io::Result<()> {
        let s = m.slot.to_string();
        let target = self.ids[m.to].clone();
        let mut order = vec![m.to, m.from];
        let others: Vec<usize> = (0..self.nodes.len())
            .filter(|i| !order.contains(i))
            .collect();
        order.extend(others);
        for i in order {
            if !self.nodes[i].is_running() {
                continue;
            }
            // A replica refuses SETSLOT; it learns the new owner from its master's gossip.
            let done = self.nodes[i].cli(&["CLUSTER", "SETSLOT", &s, "NODE", &target]);
            if i == m.to || i == m.from {
                done?;
            }
        }
        self.wait_until("every node routes the migrated slot to its target", |s| {
            let running: Vec<usize> = (0..s.nodes.len())
                .filter(|&i| s.nodes[i].is_running())
                .collect();
            running.iter().all(|&i| {
                view(&s.nodes[i]).is_some_and(|v| {
                    v.iter()
                        .any(|l| l.port == s.nodes[m.to].port() && l.serves(m.slot))
                })
            })
        })
    }

    /// Moves `slot` to master `to`, keys and all.
    ///
    /// # Errors
    ///
    /// As for the three steps.
    pub fn migrate_slot(&mut self, slot: u16, to: usize) -> io::Result<()> {
        let m = self.begin_migration(slot, to)?;
        self.move_keys(m, None)?;
        self.finish_migration(m)
    }

    /// The indices of the nodes that run.
    fn running(&mut self) -> impl Iterator<Item = &RedisServer> {
        let alive: Vec<bool> = self.nodes.iter_mut().map(|n| n.is_running()).collect();
        self.nodes
            .iter()
            .zip(alive)
            .filter_map(|(n, a)| a.then_some(n))
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// A slot `master` serves.
    fn served_slot(&mut self, master: usize) -> io::Result<u16> {
        let port = self.nodes[master].port();
        view(&self.nodes[master])
            .and_then(|v| {
                v.into_iter()
                    .find(|l| l.port == port)
                    .and_then(|l| l.slots.first().map(|r| r.0))
            })
            .ok_or_else(|| io::Error::other(format!("node {master} serves no slot")))
    }

    /// Whether every running node sees `node` as a master that is not failing.
    fn agree_on_master(&mut self, node: usize) -> bool {
        let port = self.nodes[node].port();
        let views: Vec<Option<Vec<NodeLine>>> = {
            let alive: Vec<bool> = self.nodes.iter_mut().map(|n| n.is_running()).collect();
            self.nodes
                .iter()
                .zip(alive)
                .filter(|(_, a)| *a)
                .map(|(n, _)| view(n))
                .collect()
        };
        views.iter().all(|v| {
            v.as_ref().is_some_and(|v| {
                v.iter()
                    .any(|l| l.port == port && l.is("master") && !l.is("fail") && !l.is("fail?"))
            })
        })
    }

    /// Waits until `replica` is master in the view of every running node and `old` is not.
    fn await_master(&mut self, replica: usize, old: usize) -> io::Result<()> {
        let old_port = self.nodes[old].port();
        self.wait_until("the replica is master in every node's view", |s| {
            let role = s.nodes[replica].cli(&["ROLE"]);
            role.is_ok_and(|r| r.starts_with("master"))
                && s.agree_on_master(replica)
                && s.running().filter_map(view).all(|v| {
                    v.iter()
                        .all(|l| l.port != old_port || !l.is("master") || l.slots.is_empty())
                })
        })?;
        self.await_state_ok()
    }

    /// Waits until every running node says `cluster_state:ok`.
    fn await_state_ok(&mut self) -> io::Result<()> {
        self.wait_until("every running node serves every slot", |s| {
            s.running().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            })
        })
    }

    /// Waits until every node serves, every node's `CLUSTER SLOTS` lists `replicas` replicas
    /// for every range, and every master has them online.
    fn await_settled(&mut self, replicas: usize) -> io::Result<()> {
        self.await_state_ok()?;
        self.wait_until("every node lists every replica", |s| {
            s.nodes.iter().all(|n| {
                let v = view(n).unwrap_or_default();
                let masters: Vec<&NodeLine> = v
                    .iter()
                    .filter(|l| l.is("master") && !l.slots.is_empty())
                    .collect();
                !masters.is_empty()
                    && masters.iter().all(|m| {
                        v.iter()
                            .filter(|l| l.master.as_deref() == Some(&m.id) && !l.is("fail"))
                            .count()
                            == replicas
                    })
            })
        })?;
        self.wait_until("every replica is in sync", |s| {
            s.nodes.iter().all(|n| {
                n.cli(&["INFO", "replication"]).is_ok_and(|r| {
                    if r.contains("role:slave") {
                        r.contains("master_link_status:up")
                    } else {
                        r.matches("state=online").count() >= replicas
                    }
                })
            })
        })
    }

    fn wait_until(
        &mut self,
        what: &str,
        mut cond: impl FnMut(&mut Self) -> bool,
    ) -> io::Result<()> {
        let start = Instant::now();
        while !cond(self) {
            if start.elapsed() > SETTLE {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis cluster: {what}: not within {SETTLE:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// `CLUSTER NODES` of `node`, parsed; `None` when it does not answer.
fn view(node: &RedisServer) -> Option<Vec<NodeLine>> {
    let text = node.cli(&["CLUSTER", "NODES"]).ok()?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(NodeLine::parse)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lines_are_parsed() {
        let l = NodeLine::parse(
            "07c3 127.0.0.1:30004@40004,host master,myself - 0 1426238317239 4 connected 0-5 9 [7->-abc]",
        )
        .unwrap();
        assert_eq!(l.port, 30004);
        assert!(l.is("myself") && l.is("master"));
        assert_eq!(l.master, None);
        assert_eq!(l.slots, [(0, 5), (9, 9)]);
        assert!(l.serves(3) && l.serves(9) && !l.serves(7));
        let r = NodeLine::parse("e7d1 127.0.0.1:30002@40002 slave 07c3 0 0 2 connected").unwrap();
        assert_eq!(r.master.as_deref(), Some("07c3"));
        assert!(r.slots.is_empty());
    }

    #[test]
    fn a_cluster_forms_and_a_slot_moves() {
        let mut set = ClusterSet::start_with(2, 1).unwrap();
        let slot = set.slot_of("k").unwrap();
        let from = set.master_of(slot).unwrap();
        assert!(from < 2);
        assert_eq!(set.replicas_of(from), [from + 2]);
        set.nodes[from].cli(&["SET", "k", "v"]).unwrap();
        let to = 1 - from;
        set.migrate_slot(slot, to).unwrap();
        assert_eq!(set.master_of(slot), Some(to));
        assert_eq!(set.nodes[to].cli(&["GET", "k"]).unwrap(), "v");
        assert!(set.nodes[from]
            .cli(&["GET", "k"])
            .unwrap_err()
            .to_string()
            .starts_with("MOVED"));
    }
}
