//! Connecting to a cluster named by a `redis+cluster://` URL: its parameters, the first read
//! of the slot map, and the credentials checked on every master.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};

use futures_util::future::join_all;

use super::super::replicas::Replicas;
use super::super::resp::{ConnInfo, Reply};
use super::super::scripts::Scripts;
use super::super::transport::{has_password, server_err, topology_scheme, TopologyUrl};
use super::super::{RedisBackend, RedisOptions};
use super::{Cluster, Topology};
use crate::error::{Error, Result};
use crate::url::{parse_hosts, RawUrl};

/// Connects to the cluster named by `url`; see the module docs.
pub(in crate::backends::redis) async fn connect(
    url: &str,
    mut options: RedisOptions,
) -> Result<RedisBackend> {
    let shown = crate::redact(url);
    let bad = |what: String| Error::config(format!("redis cluster URL {shown:?}: {what}"));
    let raw = RawUrl::split(url)
        .ok_or_else(|| bad("expected redis+cluster://host:port[,host:port]".into()))?;
    let (scheme, tls) = topology_scheme(raw.scheme, "cluster").map_err(bad)?;
    let hosts = parse_hosts(raw.hosts, 6379).map_err(bad)?;
    if !matches!(raw.path, "" | "/" | "/0") {
        return Err(bad(format!(
            "a path {:?}: Redis Cluster has only database 0",
            raw.path
        )));
    }
    let mut url_parts = TopologyUrl::read("redis cluster", &raw, bad)?;
    let legacy = url_parts
        .params
        .bool("spring_legacy_channel")?
        .unwrap_or(false);
    let (user, password) = (url_parts.user.take(), url_parts.password.take());
    let (min_replicas, replica_timeout) = (url_parts.min_replicas, url_parts.replica_timeout);
    let access = url_parts.finish(
        &["spring_legacy_channel"],
        &format!("redis cluster URL {shown:?}"),
        &raw,
        tls,
        has_password(raw.userinfo),
        &mut options,
    )?;

    let seeds: Vec<String> = hosts.iter().map(ToString::to_string).collect();
    // The `redis` crate's client of the skeleton is never used: pub/sub goes to a node of the
    // slot map (see `Cluster::pubsub`).
    let mut backend = RedisBackend::build(&format!("redis://{}", seeds[0]), options.clone())?;
    backend.pool = None;
    // A failover can lose the last increments of a fence counter: fences are floored at the
    // server clock, so the promoted replica's next fence is still higher.
    backend.scripts = Scripts::new(true);
    backend.target = format!("{scheme}://{}", seeds.join(","));
    backend.spring_legacy_channel = legacy;
    backend.replica_timeout_ms = replica_timeout.as_millis().try_into().unwrap_or(u64::MAX);
    let cluster = Cluster {
        template: ConnInfo {
            addr: String::new(),
            user,
            password,
            db: 0,
            connect_timeout: options.connect_timeout,
            response_timeout: options.response_timeout,
            sentinel: None,
            node_id: None,
            tls: access.resp_tls(),
        },
        seeds,
        access,
        topology: RwLock::new(Arc::new(Topology::empty())),
        pools: Mutex::new(HashMap::new()),
        refreshing: tokio::sync::Mutex::new(None),
        generation: AtomicU64::new(0),
        stale: AtomicBool::new(false),
    };
    cluster.refresh(0, true).await?;
    let topology = cluster.topology();
    // Every master must accept the credentials, not only the one that gave the map.
    let pings = join_all(topology.masters.iter().map(|m| {
        let pool = cluster.pool(&m.addr);
        async move { (m.addr.clone(), pool.pipeline(&[[b"PING".as_slice()]]).await) }
    }))
    .await;
    for (addr, ping) in pings {
        match ping {
            Ok(r) => {
                if let Some(Reply::Error(e)) = r.first() {
                    let err = server_err(e.clone());
                    if !err.is_retryable() {
                        return Err(err);
                    }
                }
            }
            Err(e) => {
                tracing::debug!(node = %addr, error = ?e, "cluster master does not answer at connect")
            }
        }
    }
    backend.replicas = Arc::new(match min_replicas {
        Some(n) => Replicas::fixed(n),
        None => {
            let replicas = Replicas::automatic();
            replicas.decide(
                cluster.generation(),
                cluster.every_master_has_replicas(),
                &backend.target,
            );
            replicas
        }
    });
    backend.cluster = Some(cluster);
    Ok(backend)
}
