//! Release notifications over pub/sub: one subscriber connection per backend, the wake-ups
//! it turns messages into, and the locks a release handed to this backend's waiters.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

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
    /// The task reading the connection's messages.
    reader: Option<tokio::task::AbortHandle>,
}

/// Lock keys this backend saw waited for: an attempt found the lock busy, or a release
/// found waiters queued. Their release goes straight to the `RELEASE` script, which hands the
/// lock over; the others' to `RELEASE_ALONE`, which costs the server less and tells when
/// waiters turned up after all. Bounded: cleared when full, which costs the contended keys
/// one round trip each.
///
/// For each such key it also keeps this backend's slice of the lock (see
/// [`RedisOptions::hold_slice`](super::RedisOptions::hold_slice)): when the slice began, and
/// whether the last release reserved the key for this backend's next acquisition.
#[derive(Default)]
pub(super) struct Contended(Mutex<HashMap<String, Slice>>);

#[derive(Default)]
pub(super) struct Slice {
    /// The end of this backend's slice: until then a release made right before the next
    /// acquisition asks for it reserves the lock for that acquisition.
    until: Option<Instant>,
    /// What this backend's last release left, until it holds the key again.
    left: Left,
    /// The head waiter was told that the slice holds the lock until its end.
    told: bool,
    /// When the last release of the key ended, until the next acquisition begins.
    released_at: Option<Instant>,
    /// The acquisition after the last release began within a slice of it: this backend takes
    /// the key in a loop, and a reservation is likely to be used. A program that releases and
    /// is done (or works a while first) leaves none, which its waiters would wait out.
    quick: bool,
}

/// What a release of a contended key left at the key.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Left {
    /// Nothing this backend knows of (it freed the key, or holds it now).
    #[default]
    Unknown,
    /// A reservation for this backend: an attempt must be the script, which recognises it (a
    /// plain `SET NX` finds it busy).
    Reserved,
    /// The lock of the waiter it was handed to: somebody else's.
    HandedOver,
}

const MAX_CONTENDED: usize = 4096;

impl Contended {
    fn with<T>(&self, key: &str, f: impl FnOnce(&mut Slice) -> T) -> Option<T> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get_mut(key).map(f)
    }

    pub(super) fn contains(&self, key: &str) -> bool {
        self.with(key, |_| ()).is_some()
    }

    pub(super) fn mark(&self, key: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(key) {
            if map.len() >= MAX_CONTENDED {
                map.clear();
            }
            map.insert(key.to_owned(), Slice::default());
        }
    }

    pub(super) fn unmark(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    /// An attempt on `key` begins. Returns `None` for a key not seen contended, else whether
    /// it is reserved for this backend.
    pub(super) fn attempting(&self, key: &str, slice: Duration) -> Option<bool> {
        self.with(key, |s| {
            if let Some(at) = s.released_at.take() {
                s.quick = at.elapsed() < slice;
            }
            s.left == Left::Reserved
        })
    }

    /// The last release of `key` handed it to a waiter, and this backend has not held it since.
    pub(super) fn handed_over(&self, key: &str) -> bool {
        self.with(key, |s| s.left == Left::HandedOver)
            .unwrap_or(false)
    }

    /// This backend holds `key` now: a slice begins, unless the lock came from this backend's
    /// reservation (`reserved`), which is part of the slice that made it (also when taken
    /// just after its end).
    pub(super) fn acquired(&self, key: &str, slice: Duration, reserved: bool) {
        self.with(key, |s| {
            s.left = Left::Unknown;
            s.released_at = None;
            let now = Instant::now();
            if !reserved || s.until.is_none() {
                s.until = Some(now + slice);
                s.told = false;
            }
        });
    }

    /// What the release of `key` asks for: `Some((ms, tell))` to reserve the key for this
    /// backend's next acquisition for `ms` (the rest of the slice) and, with `tell`, to tell
    /// the head waiter so; `None` to hand the lock over (or free it).
    pub(super) fn reservation(&self, key: &str) -> Option<(u64, bool)> {
        self.with(key, |s| {
            let left = s.until?.checked_duration_since(Instant::now())?;
            let ms = u64::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
            (s.quick && ms >= 1).then_some((ms, !s.told))
        })
        .flatten()
    }

    /// A release of `key` ended, leaving `left`.
    pub(super) fn released(&self, key: &str, left: Left) {
        self.with(key, |s| {
            s.released_at = Some(Instant::now());
            s.left = left;
            if left == Left::Reserved {
                s.told = true;
            } else {
                s.until = None;
            }
        });
    }
}

/// Locks handed to this backend's waiters by a release (token → fence), until the waiter
/// takes them ([`RedisBackend::take_grant`]) or stops waiting, and for each waiter the fence
/// counter its last queued attempt found.
///
/// That floor is what makes a grant safe to take. A hand-over's lease starts on the server;
/// the registry counts it from before the waiter's last busy attempt was sent, which is only
/// early enough if the hand-over came after that attempt. A hand-over before it, whose
/// message came late (the waiter's process was stopped, or the pub/sub connection lagged
/// behind the command connection), had already run out when the attempt found the lock busy,
/// and may have been passed on since. Fences increase with every hand-over and acquisition,
/// so a grant is only taken when its fence exceeds the counter the last busy attempt saw.
///
/// Bounded: the table is cleared when it fills; a waiter whose floor went with it takes no
/// grant and makes an attempt instead, which finds the lock carrying its token.
#[derive(Default)]
pub(super) struct Grants(Mutex<HashMap<[u8; 32], Place>>);

#[derive(Default)]
pub(super) struct Place {
    /// The fence counter the waiter's last busy attempt saw.
    floor: Option<u64>,
    /// The fence of a hand-over to the waiter after that attempt.
    fence: Option<u64>,
    /// When the lease of the waiter's last busy attempt, counted from when it was sent, ends:
    /// a hand-over not taken by then is left to the next attempt, which asks the server.
    until: Option<Instant>,
}

const MAX_GRANTS: usize = 16_384;

impl Grants {
    fn place(&self, token: [u8; 32], f: impl FnOnce(&mut Place)) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= MAX_GRANTS && !g.contains_key(&token) {
            g.clear();
        }
        f(g.entry(token).or_default());
    }

    /// A release handed the lock to `token` with `fence`.
    pub(super) fn insert(&self, token: [u8; 32], fence: u64) {
        self.place(token, |p| {
            if p.floor.is_none_or(|floor| fence > floor) {
                p.fence = Some(fence);
            }
        });
    }

    /// A queued attempt of `token` found the lock busy with the key's fence counter at
    /// `floor`: a hand-over to `token` with a fence up to it came before the attempt and is
    /// void.
    pub(super) fn busy(&self, token: [u8; 32], floor: u64) {
        self.place(token, |p| {
            let floor = p.floor.map_or(floor, |f| f.max(floor));
            p.floor = Some(floor);
            p.fence = p.fence.filter(|&fence| fence > floor);
        });
    }

    /// The busy attempt of `token` that set its floor was sent with a lease ending at
    /// `until` (where the attempt left a place here).
    pub(super) fn busy_until(&self, token: &[u8; 32], until: Instant) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(place) = g.get_mut(token) {
            place.until = Some(until);
        }
    }

    /// The fence of a hand-over to `token` after its last busy attempt, once, while that
    /// attempt's lease lasts. Keeps the floor while there is none, for a message still on its
    /// way.
    pub(super) fn take(&self, token: &[u8; 32]) -> Option<u64> {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let place = g.get_mut(token)?;
        let fence = place.fence.take().filter(|_| place.floor.is_some())?;
        if place.until.is_some_and(|until| Instant::now() >= until) {
            return None;
        }
        g.remove(token);
        Some(fence)
    }

    /// `token` stopped waiting (it holds the lock, or gave up).
    pub(super) fn forget(&self, token: &[u8; 32]) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token);
    }
}

/// Turns pub/sub messages into wake-ups: a wake message `<token>:<instance>:<fence>` hands
/// the lock to a queued waiter, a release message names the lock key.
pub(super) async fn read_messages(
    mut stream: redis::aio::PubSubStream,
    signals: Weak<ReleaseSignals>,
    grants: Weak<Grants>,
    relisten: Weak<AtomicBool>,
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
    // The connection is gone: the next attempt subscribes again, and every waiter re-checks
    // now (its next attempt is that one).
    if let Some(relisten) = relisten.upgrade() {
        relisten.store(true, Ordering::Release);
    }
    if let Some(signals) = signals.upgrade() {
        signals.fire_all();
    }
}

impl RedisBackend {
    /// Makes sure the pub/sub connection listens on the prefix's release and wake channels.
    pub(super) async fn ensure_listening(&self, name: &LockName) -> Result<()> {
        self.listen(Some(Self::channel(name)), false).await
    }

    /// After the pub/sub connection dropped, or a failover moved the master (Sentinel's
    /// `+switch-master`), subscribes every channel again on a node that serves now, so that
    /// waiters who subscribed before hear releases again. A failure leaves it asked for.
    pub(super) async fn relisten_if_asked(&self) {
        if self.relisten.load(Ordering::Relaxed) && self.relisten.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.listen(None, true).await {
                tracing::debug!(error = %e, "pub/sub not re-established; waiters poll");
                self.relisten.store(true, Ordering::Release);
            }
        }
    }

    /// Listens on `channel` (and its wake channel) as well as on every channel listened to
    /// before; with `fresh`, on a new connection even if the old one still stands.
    async fn listen(&self, channel: Option<String>, fresh: bool) -> Result<()> {
        let mut ps = self.pubsub.lock().await;
        if channel.is_none() && ps.channels.is_empty() {
            // Nobody listened yet: the first subscription connects.
            return Ok(());
        }
        let dead = ps.alive.as_ref().is_none_or(|w| w.strong_count() == 0);
        if dead || fresh {
            let pubsub = match (&self.sentinel, &self.cluster) {
                // Subscribed on the master the Sentinels name now.
                (Some(mode), _) => mode.client(self).await?.get_async_pubsub().await,
                // Any node: the cluster forwards every PUBLISH to all of them.
                (None, Some(cluster)) => Ok(cluster.pubsub().await?),
                (None, None) => self.client.get_async_pubsub().await,
            }
            .map_err(map_err)?;
            let (mut sink, stream) = pubsub.split();
            let known = std::mem::take(&mut ps.channels);
            for c in &known {
                if let Err(e) = self.subscribe_prefix(&mut sink, c).await {
                    ps.channels = known;
                    return Err(e);
                }
            }
            let alive = Arc::new(());
            ps.alive = Some(Arc::downgrade(&alive));
            ps.sink = Some(sink);
            ps.channels = known;
            let reader = tokio::spawn(read_messages(
                stream,
                Arc::downgrade(&self.signals),
                Arc::downgrade(&self.grants),
                Arc::downgrade(&self.relisten),
                format!("-wake:{}", self.instance),
                alive,
            ));
            // A replaced connection that still stands would only hear a demoted master.
            if let Some(old) = ps.reader.replace(reader.abort_handle()) {
                old.abort();
            }
            if fresh {
                // Releases while the old connection heard nothing: every waiter re-checks.
                self.signals.fire_all();
            }
        }
        if let Some(channel) = channel.filter(|c| !ps.channels.contains(c)) {
            let mut sink = ps
                .sink
                .take()
                .ok_or_else(|| Error::unavailable(KIND, "no pub/sub connection"))?;
            let res = self.subscribe_prefix(&mut sink, &channel).await;
            ps.sink = Some(sink);
            if let Err(e) = res {
                ps.alive = None;
                return Err(e);
            }
            ps.channels.insert(channel);
        }
        Ok(())
    }

    /// Subscribes `sink` to a prefix's release channel `channel` (`<prefix>-channel`), its
    /// per-key pattern and this instance's wake channel.
    async fn subscribe_prefix(&self, sink: &mut PubSubSink, channel: &str) -> Result<()> {
        let prefix = channel.strip_suffix("-channel").unwrap_or(channel);
        let wake = format!("{prefix}-wake:{}", self.instance);
        sink.subscribe(&[channel.to_owned(), wake])
            .await
            .map_err(map_err)?;
        sink.psubscribe(format!("{channel}:*"))
            .await
            .map_err(map_err)
    }
}
