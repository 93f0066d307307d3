//! Redis under Sentinel: `redis+sentinel://[user:pass@]host:port[,host:port]/MASTER[?params]`,
//! or `rediss+sentinel://` for TLS to the Sentinels and the data nodes alike.
//!
//! The host list names the Sentinels (default port 26379); the user info is for the data
//! nodes. Every new connection of the lock path asks the Sentinels, in turn, where the master
//! is and checks with `ROLE` that it is one; an I/O error or a `READONLY` reply (a master that a
//! failover demoted) empties the connection pool, so the next request follows the failover. A
//! task listens to the Sentinels' `+switch-master` and empties the pool as soon as the master
//! moves; the pub/sub connection then moves to the new master with the next attempt.
//!
//! Query parameters: `min_replicas` (replicas that must acknowledge an acquisition or an
//! extension with `WAIT` before it counts; default 1 when the master has replicas, else 0),
//! `replica_timeout` (how long `WAIT` may take, default 1 s), `sentinel_user` and
//! `sentinel_password` (the Sentinels' own credentials), `db`, `hold_slice` (see
//! [`RedisOptions::hold_slice`](super::RedisOptions::hold_slice)), and with `rediss+sentinel://`
//! `ca_file` (PEM certificates of the authority that signed the servers' certificates; the
//! Mozilla roots without it). Each certificate is verified for the host the Sentinels name,
//! so the servers' certificates must carry the addresses they announce.
//!
//! Fences are floored at the master's clock (see `scripts::floored_fence!`): a replica that
//! Sentinel promotes before it received the last `INCR`s of a counter still issues higher
//! fences.
//!
//! What `WAIT` closes, and what it does not: an acquisition or extension acknowledged by
//! `min_replicas` replicas survives the failover that promotes one of them, so the new master
//! knows the holder and its fence. Replication stays asynchronous: Sentinel may promote a
//! replica that had not acknowledged yet (with several replicas and `min_replicas` below their
//! number), and a write acknowledged by no replica in time is reported as a failure
//! (`Error::Unavailable`), although the master may have applied it; the registry then gives
//! the token back. A hold whose key the promoted replica lacks is reported lost at its next
//! renewal.

use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;

use super::replicas::{connected_replicas, Replicas};
use super::resp::{ConnInfo, Pool, SentinelInfo, Subscriber};
use super::scripts::Scripts;
use super::transport::{has_password, topology_scheme, NodeAccess, TopologyUrl};
use super::{RedisBackend, RedisOptions, KIND};
use crate::backend::ReleaseSignals;
use crate::error::{Error, Result};
use crate::url::{parse_hosts, RawUrl};

/// What the pub/sub side needs to follow the master.
pub(super) struct Mode {
    access: NodeAccess,
    db: u16,
    /// Dropped with the backend, which ends the task that follows `+switch-master`.
    _switches: oneshot::Sender<()>,
}

impl Mode {
    /// A `redis` crate client for the master the Sentinels name now (else the one the lock
    /// path reached last).
    pub(super) async fn client(&self, backend: &RedisBackend) -> Result<redis::Client> {
        let pool = backend
            .pool
            .as_ref()
            .ok_or_else(|| Error::unavailable(KIND, "no connection pool"))?;
        let master = match pool.current_master().await {
            Ok(m) => m,
            Err(_) => pool
                .master()
                .ok_or_else(|| Error::unavailable(KIND, "no master found through Sentinel yet"))?,
        };
        self.access.client(&master, self.db)
    }
}

/// What a master switch changes in the backend; the task ends when the backend is gone.
struct Following {
    pool: Weak<Pool>,
    relisten: Weak<AtomicBool>,
    signals: Weak<ReleaseSignals>,
    replicas: Weak<Replicas>,
}

/// Listens to the Sentinels' `+switch-master` (one Sentinel at a time, the next one when it
/// stops answering) and, when `master` moves, empties the pool so that no request goes to the
/// old master, and asks the pub/sub side to move too (waiters are woken to re-check). Without
/// it, requests follow a failover at their next error (an I/O error or `READONLY`), and
/// waiters that subscribed on a demoted master that is still up would only poll. Ends when
/// `stop`'s sender (the backend) is dropped.
async fn follow_switches(
    sentinel: SentinelInfo,
    timeout: Duration,
    tls: Option<super::resp::Tls>,
    backend: Following,
    mut stop: oneshot::Receiver<()>,
) {
    let mut backoff = Duration::from_millis(100);
    for host in sentinel.hosts.iter().cycle() {
        let connect = Subscriber::connect(
            host,
            sentinel.user.as_deref(),
            sentinel.password.as_deref(),
            timeout,
            tls.as_ref(),
            "+switch-master",
        );
        let subscribed = tokio::select! {
            _ = &mut stop => return,
            s = connect => s,
        };
        if let Ok(mut sub) = subscribed {
            backoff = Duration::from_millis(100);
            loop {
                let message = tokio::select! {
                    _ = &mut stop => return,
                    m = sub.next_message() => m,
                };
                let Ok(payload) = message else { break };
                // `<master name> <old ip> <old port> <new ip> <new port>`
                let text = String::from_utf8_lossy(&payload);
                if text.split(' ').next() != Some(sentinel.master.as_str()) {
                    continue;
                }
                let (Some(pool), Some(relisten), Some(signals), Some(replicas)) = (
                    backend.pool.upgrade(),
                    backend.relisten.upgrade(),
                    backend.signals.upgrade(),
                    backend.replicas.upgrade(),
                ) else {
                    return;
                };
                tracing::debug!(event = %text, "+switch-master: following the new master");
                pool.clear();
                relisten.store(true, Ordering::Release);
                replicas.topology_changed();
                // Their next attempts reach the new master, the first one moves pub/sub there.
                signals.fire_all();
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Connects through the Sentinels named by `url`; see the module docs.
pub(super) async fn connect(url: &str, mut options: RedisOptions) -> Result<RedisBackend> {
    let shown = crate::redact(url);
    let bad = |what: String| Error::config(format!("redis sentinel URL {shown:?}: {what}"));
    let raw = RawUrl::split(url)
        .ok_or_else(|| bad("expected redis+sentinel://host:port/MASTER".into()))?;
    let (scheme, tls) = topology_scheme(raw.scheme, "sentinel").map_err(bad)?;
    let hosts = parse_hosts(raw.hosts, 26379).map_err(bad)?;
    let master = raw.path.trim_start_matches('/');
    if master.is_empty() || master.contains('/') {
        return Err(bad(format!(
            "the path must be the master's name, as in /mymaster (got {:?})",
            raw.path
        )));
    }
    let mut url_parts = TopologyUrl::read("redis sentinel", &raw, bad)?;
    let sentinel_user = url_parts.params.decoded("sentinel_user")?;
    let sentinel_password = url_parts.params.decoded("sentinel_password")?;
    let db = url_parts.params.integer::<u16>("db")?.unwrap_or(0);
    let (user, password) = (url_parts.user.take(), url_parts.password.take());
    let (min_replicas, replica_timeout) = (url_parts.min_replicas, url_parts.replica_timeout);
    let access = url_parts.finish(
        &["sentinel_user", "sentinel_password", "db"],
        &format!("redis sentinel URL {shown:?}"),
        &raw,
        tls,
        has_password(raw.userinfo) || sentinel_password.as_deref().is_some_and(|p| !p.is_empty()),
        &mut options,
    )?;
    // The `redis` crate's client of the skeleton is never used: pub/sub goes to the master
    // found at run time (see `Mode::client`).
    let mut backend = RedisBackend::build(&format!("redis://{}/{db}", hosts[0]), options.clone())?;
    backend.scripts = Scripts::new(true);
    backend.replicas = Arc::new(min_replicas.map_or_else(Replicas::automatic, Replicas::fixed));
    let sentinels: Vec<String> = hosts.iter().map(ToString::to_string).collect();
    backend.target = format!("{scheme}://{}/{master}", sentinels.join(","));
    let sentinel = SentinelInfo {
        hosts: sentinels,
        master: master.to_owned(),
        user: sentinel_user,
        password: sentinel_password,
    };
    let pool = Arc::new(Pool::new(ConnInfo {
        addr: String::new(),
        user,
        password,
        db,
        connect_timeout: options.connect_timeout,
        response_timeout: options.response_timeout,
        sentinel: Some(sentinel.clone()),
        node_id: None,
        tls: access.resp_tls(),
    }));
    let (switches, stop) = oneshot::channel();
    tokio::spawn(follow_switches(
        sentinel,
        options.connect_timeout,
        access.resp_tls(),
        Following {
            pool: Arc::downgrade(&pool),
            relisten: Arc::downgrade(&backend.relisten),
            signals: Arc::downgrade(&backend.signals),
            replicas: Arc::downgrade(&backend.replicas),
        },
        stop,
    ));
    backend.pool = Some(pool);
    backend.sentinel = Some(Mode {
        access,
        db,
        _switches: switches,
    });
    backend.replica_timeout_ms = replica_timeout.as_millis().try_into().unwrap_or(u64::MAX);
    backend.ping().await?;
    if min_replicas.is_none() {
        let n = connected_replicas(&backend).await?;
        backend.replicas.decide(0, n > 0, &backend.target);
    }
    Ok(backend)
}
