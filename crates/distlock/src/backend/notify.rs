//! Release notifications: [`ReleaseSignal`] (one wake-up source), [`ReleaseSubscription`] (a
//! waiter's view of one or more signals) and [`ReleaseSignals`] (the table by channel name that
//! every notifying backend keeps).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// A wake-up source shared by all subscribers of one lock name.
#[derive(Debug, Default)]
pub struct ReleaseSignal {
    /// Counts every release seen.
    generation: AtomicU64,
    notify: Notify,
}

impl ReleaseSignal {
    /// Wakes every subscription of this signal.
    pub fn fire(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.notify.notify_waiters();
    }

    /// How many times it fired so far.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// A subscription to the releases of one lock. [`released`](Self::released) completes once for
/// every release that happened after the subscription was made (several releases between two
/// calls count once).
pub struct ReleaseSubscription {
    parts: Vec<(Arc<ReleaseSignal>, u64)>,
    _keep: Vec<Box<dyn Send + Sync>>,
}

impl fmt::Debug for ReleaseSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseSubscription")
            .field("signals", &self.parts.len())
            .finish()
    }
}

impl ReleaseSubscription {
    /// A subscription that never fires (backends without notifications).
    pub fn never() -> Self {
        ReleaseSubscription {
            parts: Vec::new(),
            _keep: Vec::new(),
        }
    }

    /// Whether anything can fire this subscription (false for [`never`](Self::never)).
    pub(crate) fn listens(&self) -> bool {
        !self.parts.is_empty()
    }

    /// A subscription to `signal`; `keep` is dropped with the subscription (a reference count
    /// that lets the backend unsubscribe when nobody listens any more).
    pub fn new(signal: Arc<ReleaseSignal>, keep: Option<Box<dyn Send + Sync>>) -> Self {
        let seen = signal.generation.load(Ordering::Acquire);
        ReleaseSubscription {
            parts: vec![(signal, seen)],
            _keep: keep.into_iter().collect(),
        }
    }

    /// One subscription that fires when either of the two does.
    pub fn merge(mut self, other: ReleaseSubscription) -> Self {
        self.parts.extend(other.parts);
        self._keep.extend(other._keep);
        self
    }

    /// Completes when the lock may have been released since the last call (or since the
    /// subscription was made). Pending forever for [`never`](Self::never).
    ///
    /// # Cancel safety
    /// Cancel safe: a release is consumed only by the call that returns for it, so dropping a
    /// pending call loses none.
    pub async fn released(&mut self) {
        if self.parts.is_empty() {
            return std::future::pending().await;
        }
        loop {
            let signals: Vec<Arc<ReleaseSignal>> = self.parts.iter().map(|p| p.0.clone()).collect();
            let mut waits = Vec::with_capacity(signals.len());
            for s in &signals {
                let mut n = Box::pin(s.notify.notified());
                n.as_mut().enable();
                waits.push(n);
            }
            let mut fired = false;
            for part in self.parts.iter_mut() {
                let now = part.0.generation.load(Ordering::Acquire);
                if now != part.1 {
                    part.1 = now;
                    fired = true;
                }
            }
            if fired {
                return;
            }
            futures_util::future::select_all(waits).await;
        }
    }
}

/// Release signals by channel name with subscriber counts: the bookkeeping every notifying
/// backend needs (which channels to listen on, whom to wake when a message arrives).
///
/// Entries made by [`subscribe`](Self::subscribe) stay until [`take_idle`](Self::take_idle)
/// forgets them; those made by [`subscribe_transient`](Self::subscribe_transient) (one per
/// waiter, say) go with their last subscription, so the table stays bounded by the live
/// subscriptions plus the idle channels a backend chooses to keep.
#[derive(Debug, Default)]
pub struct ReleaseSignals {
    map: Arc<Mutex<HashMap<String, SignalEntry>>>,
}

#[derive(Debug, Clone)]
struct SignalEntry {
    signal: Arc<ReleaseSignal>,
    /// Subscriber count: the strong count minus the map's own reference.
    subscribers: Arc<()>,
}

impl ReleaseSignals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SignalEntry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Subscribes to `channel`. The boolean is true when the channel had no live subscription
    /// entry yet, so the backend must start listening on the server before returning.
    pub fn subscribe(&self, channel: &str) -> (ReleaseSubscription, bool) {
        let mut map = self.lock();
        let (entry, fresh) = match map.get(channel) {
            Some(e) => (e.clone(), false),
            None => {
                let e = SignalEntry {
                    signal: Arc::new(ReleaseSignal::default()),
                    subscribers: Arc::new(()),
                };
                map.insert(channel.to_owned(), e.clone());
                (e, true)
            }
        };
        (
            ReleaseSubscription::new(entry.signal, Some(Box::new(entry.subscribers))),
            fresh,
        )
    }

    /// Subscribes to `channel` for as long as the returned subscription (or another one of the
    /// same channel) lives: the last one to go removes the channel's entry. For channels that
    /// are used once, such as a waiter's own wake-up channel, so that they do not pile up.
    pub fn subscribe_transient(&self, channel: &str) -> ReleaseSubscription {
        let entry = self
            .lock()
            .entry(channel.to_owned())
            .or_insert_with(|| SignalEntry {
                signal: Arc::new(ReleaseSignal::default()),
                subscribers: Arc::new(()),
            })
            .clone();
        ReleaseSubscription::new(
            entry.signal,
            Some(Box::new(TransientEntry {
                map: Arc::downgrade(&self.map),
                channel: channel.to_owned(),
                subscribers: Some(entry.subscribers),
            })),
        )
    }

    /// How many channels have an entry (live or idle).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no channel has an entry.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Wakes the subscribers of `channel`, if any: a release message arrived.
    pub fn fire(&self, channel: &str) {
        if let Some(e) = self.lock().get(channel) {
            e.signal.fire();
        }
    }

    /// Whether some subscription of `channel` is still alive.
    pub fn has_subscribers(&self, channel: &str) -> bool {
        self.lock()
            .get(channel)
            .is_some_and(|e| Arc::strong_count(&e.subscribers) > 1)
    }

    /// Whether `channel` currently has a live subscription entry.
    pub fn is_subscribed(&self, channel: &str) -> bool {
        self.lock().contains_key(channel)
    }

    /// Forgets channels that nobody listens to, once more than `keep_idle` idle channels have
    /// accumulated, and returns them so the backend can stop listening on the server.
    pub fn take_idle(&self, keep_idle: usize) -> Vec<String> {
        let mut map = self.lock();
        let idle = |e: &SignalEntry| Arc::strong_count(&e.subscribers) == 1;
        if map.values().filter(|e| idle(e)).count() <= keep_idle {
            return Vec::new();
        }
        let names: Vec<String> = map
            .iter()
            .filter(|(_, e)| idle(e))
            .map(|(k, _)| k.clone())
            .collect();
        for n in &names {
            map.remove(n);
        }
        names
    }

    /// Wakes every subscriber (after a reconnect the server forgot the subscriptions, so
    /// waiters re-check and the backend listens again) and returns how many channels were woken.
    ///
    /// Nothing is copied while the table is locked: each signal is fired in place, which only
    /// bumps its counter and schedules its waiting tasks.
    pub fn fire_all(&self) -> usize {
        let map = self.lock();
        for e in map.values() {
            e.signal.fire();
        }
        map.len()
    }
}

/// A subscription's hold on a transient channel: the last one to go removes the entry.
struct TransientEntry {
    map: std::sync::Weak<Mutex<HashMap<String, SignalEntry>>>,
    channel: String,
    subscribers: Option<Arc<()>>,
}

impl Drop for TransientEntry {
    fn drop(&mut self) {
        let (Some(map), Some(mine)) = (self.map.upgrade(), self.subscribers.take()) else {
            return;
        };
        let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
        // Under the table's lock, so no new subscriber can appear between the check and the
        // removal: only the map's reference and ours are left.
        if map
            .get(&self.channel)
            .is_some_and(|e| Arc::ptr_eq(&e.subscribers, &mine) && Arc::strong_count(&mine) == 2)
        {
            map.remove(&self.channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn transient_channels_go_with_their_last_subscription() {
        let signals = ReleaseSignals::default();
        let (keep, _) = signals.subscribe("lock:a");
        for i in 0..1000 {
            let one = signals.subscribe_transient(&format!("waiter:{i}"));
            let two = signals.subscribe_transient(&format!("waiter:{i}"));
            drop(one);
            assert_eq!(signals.len(), 2, "dropped while another subscription lives");
            drop(two);
        }
        assert_eq!(signals.len(), 1, "only the lasting channel is left");
        drop(keep);
        assert_eq!(signals.len(), 1, "lasting channels wait for take_idle");
        assert_eq!(signals.take_idle(0), vec!["lock:a".to_owned()]);
        assert!(signals.is_empty());
    }

    #[tokio::test]
    async fn fire_all_wakes_every_subscription() {
        let signals = ReleaseSignals::default();
        let (mut a, _) = signals.subscribe("lock:a");
        let mut b = signals.subscribe_transient("waiter:b");
        assert_eq!(signals.fire_all(), 2);
        tokio::time::timeout(Duration::from_secs(1), a.released())
            .await
            .expect("a woken");
        tokio::time::timeout(Duration::from_secs(1), b.released())
            .await
            .expect("b woken");
    }
}
