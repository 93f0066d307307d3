//! Release notifications over pub/sub: one subscriber connection per backend, the wake-ups
//! it turns messages into, and the locks a release handed to this backend's waiters.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use futures_util::StreamExt;
use redis::aio::PubSubSink;

use super::transport::map_err;
use super::{RedisBackend, KIND};
use crate::backend::{LockName, ReleaseSignals};
use crate::error::{Error, Result};

#[derive(Default)]
pub(super) struct PubSub {
    sink: Option<PubSubSink>,
    channels: HashSet<String>,
    alive: Option<Weak<()>>,
}

/// Locks handed to this backend's waiters by a release (token → fence), until the waiter
/// takes them ([`Backend::take_grant`]) or stops waiting. Bounded: a grant nobody takes (its
/// waiter is gone) is forgotten when the table fills, and a forgotten grant only costs the
/// waiter an attempt, which finds the lock carrying its token.
#[derive(Default)]
pub(super) struct Grants(Mutex<HashMap<[u8; 32], u64>>);

const MAX_GRANTS: usize = 4096;

impl Grants {
    pub(super) fn insert(&self, token: [u8; 32], fence: u64) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= MAX_GRANTS {
            g.clear();
        }
        g.insert(token, fence);
    }

    pub(super) fn take(&self, token: &[u8; 32]) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token)
    }
}

/// Turns pub/sub messages into wake-ups: a wake message `<token>:<instance>:<fence>` hands
/// the lock to a queued waiter, a release message names the lock key.
pub(super) async fn read_messages(
    mut stream: redis::aio::PubSubStream,
    signals: Weak<ReleaseSignals>,
    grants: Weak<Grants>,
    wake_suffix: String,
    _alive: Arc<()>,
) {
    while let Some(msg) = stream.next().await {
        let Some(signals) = signals.upgrade() else {
            return;
        };
        let Ok(payload) = msg.get_payload::<String>() else {
            continue;
        };
        if !msg.from_pattern() && msg.get_channel_name().ends_with(&wake_suffix) {
            let Some((token, rest)) = payload.split_once(':') else {
                continue;
            };
            let fence = rest
                .rsplit_once(':')
                .and_then(|(_, f)| f.parse::<u64>().ok());
            if let (Some(fence), Ok(key), Some(grants)) = (
                fence,
                <[u8; 32]>::try_from(token.as_bytes()),
                grants.upgrade(),
            ) {
                // Before the wake-up, so that the woken waiter finds it.
                grants.insert(key, fence);
            }
            signals.fire(token);
        } else {
            signals.fire(&payload);
        }
    }
    // The connection is gone: wake every waiter so it re-checks (and resubscribes).
    if let Some(signals) = signals.upgrade() {
        signals.fire_all();
    }
}

impl RedisBackend {
    /// Makes sure the pub/sub connection listens on the prefix's release and wake channels.
    pub(super) async fn ensure_listening(&self, name: &LockName) -> Result<()> {
        let channel = Self::channel(name);
        let mut ps = self.pubsub.lock().await;
        let dead = ps.alive.as_ref().is_none_or(|w| w.strong_count() == 0);
        if dead {
            let pubsub = match &self.sentinel {
                // Subscribed on the master the lock path reaches now.
                Some(mode) => mode.client(self)?.get_async_pubsub().await,
                None => self.client.get_async_pubsub().await,
            }
            .map_err(map_err)?;
            let (sink, stream) = pubsub.split();
            let alive = Arc::new(());
            ps.alive = Some(Arc::downgrade(&alive));
            ps.sink = Some(sink);
            ps.channels.clear();
            tokio::spawn(read_messages(
                stream,
                Arc::downgrade(&self.signals),
                Arc::downgrade(&self.grants),
                format!("-wake:{}", self.instance),
                alive,
            ));
        }
        if !ps.channels.contains(&channel) {
            let sink = ps
                .sink
                .as_mut()
                .ok_or_else(|| Error::unavailable(KIND, "no pub/sub connection"))?;
            let wake = format!("{}{}", Self::wake_prefix(name), self.instance);
            let mut res = sink.subscribe(&[channel.clone(), wake]).await;
            if res.is_ok() {
                res = sink.psubscribe(format!("{channel}:*")).await;
            }
            if let Err(e) = res {
                ps.alive = None;
                return Err(map_err(e));
            }
            ps.channels.insert(channel);
        }
        Ok(())
    }
}
