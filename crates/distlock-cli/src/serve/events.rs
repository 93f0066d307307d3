//! The board: what the service shows (holds and waiters it knows of), the recent timeline,
//! and the live event stream (`GET /v1/events`, server-sent events) that the page follows.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use distlock::LockKind;
use futures_util::Stream;
use serde::Serialize;
use tokio::sync::{broadcast, watch};

/// How many events the timeline keeps for a page that connects later.
const TIMELINE_LEN: usize = 200;
/// How many events a slow subscriber may fall behind before it skips ahead.
const CHANNEL_LEN: usize = 4096;

/// A key or a holder's name as the board keeps it: one allocation per hold or waiter,
/// shared by its entry and its events.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<str>);

/// A string in the API's schemas.
impl utoipa::PartialSchema for Name {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <String as utoipa::PartialSchema>::schema()
    }
}

impl utoipa::ToSchema for Name {}

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        Name(Arc::from(s))
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Who holds or waits, as the board shows it: a name, and the demonstration it works for.
#[derive(Debug, Clone)]
pub struct Holder {
    pub name: Name,
    /// The demonstration (`POST /demo`) whose worker this is.
    pub demo: Option<u64>,
}

impl From<&str> for Holder {
    fn from(s: &str) -> Self {
        Holder {
            name: Name::from(s),
            demo: None,
        }
    }
}

impl Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// One change of the board, as sent on `/v1/events` (the SSE event name is `kind`). Shared
/// (`Arc`) between the timeline and the subscribers.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Event {
    /// `acquired`, `extended`, `released`, `lost`, `waiting`, `stopped_waiting`,
    /// `demo_started` or `demo_ended`.
    pub kind: &'static str,
    pub key: Name,
    /// The hold's id on the board (not its token: tokens stay with their caller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiter: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<Name>,
    /// The kind of the hold (`acquired` only): `mutex`, `read`, `write` or `semaphore`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_kind: Option<&'static str>,
    /// A semaphore's permits (`acquired` of a permit only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The demonstration the event belongs to: its workers' events and its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demo: Option<u64>,
    /// What `demo_started` and `demo_ended` tell of their demonstration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demonstration: Option<DemoReport>,
    /// Wall-clock time of the event, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Its place in the order of events (from 1): a page that loads the list while following
    /// the stream applies only the events after the list's `seq`.
    pub seq: u64,
}

impl Event {
    fn new(kind: &'static str, key: &Name) -> Self {
        Self::at(kind, key, SystemTime::now())
    }

    fn at(kind: &'static str, key: &Name, at: SystemTime) -> Self {
        Event {
            kind,
            key: key.clone(),
            hold: None,
            waiter: None,
            fence: None,
            holder: None,
            lock_kind: None,
            permits: None,
            lease_ms: None,
            reason: None,
            demo: None,
            demonstration: None,
            at_ms: epoch_ms(at),
            seq: 0,
        }
    }
}

/// A demonstration as its `demo_started` and `demo_ended` events tell it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DemoReport {
    pub workers: u32,
    pub hold_ms: u64,
    /// `demo_ended`: how many workers got the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquisitions: Option<u32>,
    /// `demo_ended`: the shortest and longest time between two consecutive acquisitions
    /// (absent with fewer than two acquisitions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_gap_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_gap_ms: Option<f64>,
    /// `demo_ended`: the service stopped it (shutdown) before every worker had its turn.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// A hold as listed by `GET /v1/locks` and drawn by the page.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ShownHold {
    pub hold: u64,
    pub key: Name,
    /// `mutex`, `read` (a shared hold), `write` or `semaphore` (one permit), as `list --json`.
    pub kind: &'static str,
    /// A semaphore's permits; absent for the other kinds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    #[serde(skip)]
    pub lock_kind: LockKind,
    pub holder: Name,
    /// The demonstration whose worker holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demo: Option<u64>,
    pub fence: u64,
    pub lease_ms: u64,
    /// When the caller's lease ends, milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
}

/// A caller waiting for a key.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ShownWaiter {
    pub waiter: u64,
    pub key: Name,
    pub holder: Name,
    /// The demonstration whose worker waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demo: Option<u64>,
    pub since_ms: u64,
}

#[derive(Default)]
struct State {
    holds: BTreeMap<u64, ShownHold>,
    waiters: BTreeMap<u64, ShownWaiter>,
    /// The events themselves, not shared: most of the time nobody follows the stream, and
    /// an event then needs no allocation of its own.
    timeline: VecDeque<Event>,
    /// The `seq` of the last event published.
    seq: u64,
}

/// Shared by the routes, the HTTP holds and the demonstration. Cheap to clone.
#[derive(Clone)]
pub struct Board {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    sender: broadcast::Sender<Arc<Event>>,
    next_id: AtomicU64,
    closed: watch::Sender<bool>,
}

impl Default for Board {
    fn default() -> Self {
        Board {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                sender: broadcast::channel(CHANNEL_LEN).0,
                next_id: AtomicU64::new(1),
                closed: watch::channel(false).0,
            }),
        }
    }
}

/// Removes a waiter from the board when it stops waiting, however that happens (acquired,
/// timed out, or the caller hung up and its request was dropped).
pub struct WaiterTicket {
    board: Board,
    id: u64,
}

impl Drop for WaiterTicket {
    fn drop(&mut self) {
        self.board.stop_waiting(self.id);
    }
}

impl Board {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Records `event` in the timeline and sends it to every subscriber. Called with the state
    /// locked, so that subscribers see events in the order the board changed.
    fn publish(state: &mut State, sender: &broadcast::Sender<Arc<Event>>, mut event: Event) {
        state.seq += 1;
        event.seq = state.seq;
        // Nobody listening is the common case: then no copy to share.
        if sender.receiver_count() > 0 {
            let _ = sender.send(Arc::new(event.clone()));
        }
        if state.timeline.len() == TIMELINE_LEN {
            state.timeline.pop_front();
        }
        state.timeline.push_back(event);
    }

    /// A new hold of `kind`; returns its id on the board. `key`: a `&str`, or a [`Name`]
    /// its caller keeps too (one allocation for both).
    pub fn acquired(
        &self,
        key: impl Into<Name>,
        holder: &Holder,
        kind: LockKind,
        fence: u64,
        lease: Duration,
    ) -> u64 {
        let id = self.next_id();
        let permits = match kind {
            LockKind::Semaphore { permits } => Some(permits),
            _ => None,
        };
        let key = key.into();
        let now = SystemTime::now();
        let mut event = Event::at("acquired", &key, now);
        let shown = ShownHold {
            hold: id,
            key,
            kind: kind.name(),
            permits,
            lock_kind: kind,
            holder: holder.name.clone(),
            demo: holder.demo,
            fence,
            lease_ms: millis(lease),
            expires_at_ms: epoch_ms(now + lease),
        };
        event.hold = Some(id);
        event.fence = Some(fence);
        event.holder = Some(shown.holder.clone());
        event.lock_kind = Some(shown.kind);
        event.permits = permits;
        event.lease_ms = Some(shown.lease_ms);
        event.demo = holder.demo;
        let mut state = self.state();
        state.holds.insert(id, shown);
        Self::publish(&mut state, &self.inner.sender, event);
        id
    }

    /// The hold's lease now ends `remaining` from now.
    pub fn extended(&self, id: u64, remaining: Duration) {
        let mut state = self.state();
        let Some(shown) = state.holds.get_mut(&id) else {
            return;
        };
        shown.lease_ms = millis(remaining);
        shown.expires_at_ms = epoch_ms(SystemTime::now() + remaining);
        let mut event = Event::new("extended", &shown.key);
        event.hold = Some(id);
        event.fence = Some(shown.fence);
        event.lease_ms = Some(shown.lease_ms);
        Self::publish(&mut state, &self.inner.sender, event);
    }

    /// The hold ended: `released` (given back) or `lost` (lease ended, taken away), with why.
    pub fn ended(&self, id: u64, kind: &'static str, reason: Option<String>) {
        let mut state = self.state();
        let Some(shown) = state.holds.remove(&id) else {
            return;
        };
        let mut event = Event::new(kind, &shown.key);
        event.hold = Some(id);
        event.fence = Some(shown.fence);
        event.holder = Some(shown.holder);
        event.demo = shown.demo;
        event.reason = reason;
        Self::publish(&mut state, &self.inner.sender, event);
    }

    /// A caller starts waiting for `key`; it is on the board until the ticket is dropped.
    pub fn waiting(&self, key: &str, holder: &Holder) -> WaiterTicket {
        let id = self.next_id();
        let now = SystemTime::now();
        let key = Name::from(key);
        let mut event = Event::at("waiting", &key, now);
        event.waiter = Some(id);
        event.holder = Some(holder.name.clone());
        event.demo = holder.demo;
        let mut state = self.state();
        state.waiters.insert(
            id,
            ShownWaiter {
                waiter: id,
                key,
                holder: holder.name.clone(),
                demo: holder.demo,
                since_ms: epoch_ms(now),
            },
        );
        Self::publish(&mut state, &self.inner.sender, event);
        WaiterTicket {
            board: self.clone(),
            id,
        }
    }

    fn stop_waiting(&self, id: u64) {
        let mut state = self.state();
        if let Some(w) = state.waiters.remove(&id) {
            let mut event = Event::new("stopped_waiting", &w.key);
            event.waiter = Some(id);
            event.demo = w.demo;
            Self::publish(&mut state, &self.inner.sender, event);
        }
    }

    /// A demonstration of `key` started (`demo_started`) or ended (`demo_ended`).
    pub fn demonstration(&self, kind: &'static str, key: &str, demo: u64, report: DemoReport) {
        let mut event = Event::new(kind, &Name::from(key));
        event.demo = Some(demo);
        event.demonstration = Some(report);
        let mut state = self.state();
        Self::publish(&mut state, &self.inner.sender, event);
    }

    /// Holds and waiters on the board, ordered by key, and the `seq` of the last event they
    /// include.
    pub fn snapshot(&self) -> (Vec<ShownHold>, Vec<ShownWaiter>, u64) {
        let state = self.state();
        let seq = state.seq;
        let mut holds: Vec<ShownHold> = state.holds.values().cloned().collect();
        let mut waiters: Vec<ShownWaiter> = state.waiters.values().cloned().collect();
        holds.sort_by(|a, b| a.key.cmp(&b.key).then(a.hold.cmp(&b.hold)));
        waiters.sort_by(|a, b| a.key.cmp(&b.key).then(a.waiter.cmp(&b.waiter)));
        (holds, waiters, seq)
    }

    /// The recent events, oldest first.
    pub fn timeline(&self) -> Vec<Event> {
        self.state().timeline.iter().cloned().collect()
    }

    /// Ends every event stream (at shutdown, so that open streams do not hold it up).
    pub fn close(&self) {
        let _ = self.inner.closed.send(true);
    }

    /// The live stream of `GET /v1/events`.
    pub fn stream(&self) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
        let receiver = self.inner.sender.subscribe();
        let closed = self.inner.closed.subscribe();
        let stream = futures_util::stream::unfold(
            (receiver, closed),
            |(mut receiver, mut closed)| async move {
                if *closed.borrow() {
                    return None;
                }
                let received = tokio::select! {
                    r = receiver.recv() => r,
                    _ = closed.changed() => return None,
                };
                let sse = match received {
                    Ok(event) => {
                        let data = serde_json::to_string(&*event).unwrap_or_default();
                        SseEvent::default().event(event.kind).data(data)
                    }
                    // A subscriber that fell behind is told so; the page reloads the list.
                    Err(broadcast::error::RecvError::Lagged(n)) => SseEvent::default()
                        .event("lagged")
                        .data(format!("{{\"skipped\":{n}}}")),
                    Err(broadcast::error::RecvError::Closed) => return None,
                };
                Some((Ok(sse), (receiver, closed)))
            },
        );
        Sse::new(stream).keep_alive(KeepAlive::default())
    }
}

/// Milliseconds since the Unix epoch.
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(millis).unwrap_or(0)
}

/// A duration in whole milliseconds, saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_board_follows_holds_and_waiters_and_numbers_its_events() {
        let board = Board::default();
        let http = Holder::from("http");
        let ticket = board.waiting("k", &http);
        let id = board.acquired("k", &http, LockKind::Read, 1024, Duration::from_secs(5));
        drop(ticket);
        let (holds, waiters, seq) = board.snapshot();
        assert_eq!(holds.len(), 1);
        assert_eq!(holds[0].fence, 1024);
        assert_eq!(holds[0].kind, "read");
        assert!(waiters.is_empty(), "the ticket's drop took the waiter off");
        assert_eq!(seq, 3);
        board.extended(id, Duration::from_secs(9));
        board.ended(id, "released", None);
        board.ended(id, "released", None); // a second end changes nothing
        let kinds: Vec<&str> = board.timeline().iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                "waiting",
                "acquired",
                "stopped_waiting",
                "extended",
                "released"
            ]
        );
        let seqs: Vec<u64> = board.timeline().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5]);
        assert!(board.snapshot().0.is_empty());
    }

    #[test]
    fn the_timeline_keeps_the_latest_events() {
        let board = Board::default();
        for i in 0..TIMELINE_LEN + 10 {
            let id = board.acquired(
                format!("k{i}").as_str(),
                &Holder::from("http"),
                LockKind::Mutex,
                1,
                Duration::from_secs(1),
            );
            board.ended(id, "lost", Some("lease ended".into()));
        }
        let timeline = board.timeline();
        assert_eq!(timeline.len(), TIMELINE_LEN);
        assert_eq!(
            timeline.last().map(|e| e.seq),
            Some(2 * (TIMELINE_LEN as u64 + 10))
        );
    }
}
