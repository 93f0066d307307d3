//! Predecessor watches: one watch stream per backend instance, shared by all waiters.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::client::{Client, WatchSender, WatchStream};
use super::options::KIND;
use super::pb::{EventType, WatchResponse};
use super::rpc_error::map_err;
use crate::backend::ReleaseSignal;
use crate::error::{Error, Result};

/// What a waiter watches: one key (created at `rev`) until it goes or is replaced, or, with a
/// `range_end`, the deletion of any key in `[key, range_end)` (a semaphore's permits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WatchTarget {
    pub(super) key: Vec<u8>,
    pub(super) rev: i64,
    /// Empty for one key.
    pub(super) range_end: Vec<u8>,
}

impl WatchTarget {
    pub(super) fn key(key: Vec<u8>, rev: i64) -> Self {
        WatchTarget {
            key,
            rev,
            range_end: Vec::new(),
        }
    }

    pub(super) fn is_range(&self) -> bool {
        !self.range_end.is_empty()
    }
}

/// A watch on one predecessor key, as the hub registered it.
#[derive(Debug)]
pub(super) struct WatchHandle {
    pub(super) generation: u64,
    pub(super) id: i64,
    pub(super) target: WatchTarget,
    pub(super) broken: Arc<AtomicBool>,
}

pub(super) enum WatchCmd {
    Create {
        target: WatchTarget,
        from: i64,
        signal: Arc<ReleaseSignal>,
        broken: Arc<AtomicBool>,
        done: oneshot::Sender<Result<(u64, i64)>>,
    },
    Cancel {
        generation: u64,
        id: i64,
    },
}

/// One watch stream per backend instance, shared by all waiters' predecessor watches.
pub(super) struct WatchHub {
    pub(super) tx: mpsc::UnboundedSender<WatchCmd>,
}

impl WatchHub {
    /// Watches `target` from revision `from` on (0: from the server's current revision);
    /// returns once the server confirmed the watch. A change after the read that found the
    /// target, from that read's revision + 1, fires at once, so no second read is needed. `signal` fires when the key is deleted or replaced (for a range:
    /// when a key in it is deleted), and when the watch breaks.
    pub(super) async fn create(
        &self,
        target: WatchTarget,
        from: i64,
        signal: Arc<ReleaseSignal>,
        timeout: Duration,
    ) -> Result<WatchHandle> {
        let broken = Arc::new(AtomicBool::new(false));
        let (done, rx) = oneshot::channel();
        self.tx
            .send(WatchCmd::Create {
                target: target.clone(),
                from,
                signal,
                broken: broken.clone(),
                done,
            })
            .map_err(|_| Error::unavailable(KIND, "watch task stopped"))?;
        let (generation, id) = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r?,
            Ok(Err(_)) => return Err(Error::unavailable(KIND, "watch task stopped")),
            Err(_) => return Err(Error::unavailable(KIND, "watch creation timed out")),
        };
        Ok(WatchHandle {
            generation,
            id,
            target,
            broken,
        })
    }

    pub(super) fn cancel(&self, w: WatchHandle) {
        let _ = self.tx.send(WatchCmd::Cancel {
            generation: w.generation,
            id: w.id,
        });
    }
}

pub(super) struct Watched {
    pub(super) rev: i64,
    /// A range: any event (only deletions are sent) fires.
    pub(super) range: bool,
    pub(super) signal: Arc<ReleaseSignal>,
    pub(super) broken: Arc<AtomicBool>,
}

/// A watch the server has not confirmed yet, and who waits for the confirmation.
pub(super) struct PendingWatch {
    pub(super) watched: Watched,
    pub(super) done: oneshot::Sender<Result<(u64, i64)>>,
}

pub(super) async fn run_watch_hub(client: Client, mut rx: mpsc::UnboundedReceiver<WatchCmd>) {
    let mut generation: u64 = 0;
    let mut sender: Option<WatchSender> = None;
    let mut stream: Option<WatchStream> = None;
    let mut active: HashMap<i64, Watched> = HashMap::new();
    // Create requests in the order sent: the server confirms them in that order.
    let mut pending: VecDeque<PendingWatch> = VecDeque::new();

    enum Ev {
        Cmd(Option<WatchCmd>),
        Msg(std::result::Result<Option<WatchResponse>, tonic::Status>),
    }

    loop {
        let ev = tokio::select! {
            c = rx.recv() => Ev::Cmd(c),
            m = async {
                match stream.as_mut() {
                    Some(s) => s.message().await,
                    None => std::future::pending().await,
                }
            } => Ev::Msg(m),
        };
        let broke = match ev {
            Ev::Cmd(None) => return,
            Ev::Cmd(Some(WatchCmd::Create {
                target,
                from,
                signal,
                broken,
                done,
            })) => {
                let (rev, range) = (target.rev, target.is_range());
                let res = match sender.as_mut() {
                    Some(s) => s.watch(target.key, target.range_end, from).await,
                    None => match client.watch(target.key, target.range_end, from).await {
                        Ok((s, r)) => {
                            sender = Some(s);
                            stream = Some(r);
                            generation += 1;
                            Ok(())
                        }
                        Err(e) => Err(e),
                    },
                };
                match res {
                    Ok(()) => {
                        let watched = Watched {
                            rev,
                            range,
                            signal,
                            broken,
                        };
                        pending.push_back(PendingWatch { watched, done });
                        false
                    }
                    Err(e) => {
                        let _ = done.send(Err(map_err(e)));
                        sender.is_some()
                    }
                }
            }
            Ev::Cmd(Some(WatchCmd::Cancel { generation: g, id })) => {
                if g == generation && active.remove(&id).is_some() {
                    if let Some(s) = sender.as_mut() {
                        let _ = s.cancel(id).await;
                    }
                }
                false
            }
            Ev::Msg(Ok(Some(resp))) => {
                let id = resp.watch_id;
                if resp.created {
                    if let Some(p) = pending.pop_front() {
                        if resp.canceled || id < 0 {
                            let _ = p.done.send(Err(Error::unavailable(
                                KIND,
                                format!("watch refused: {}", resp.cancel_reason),
                            )));
                        } else {
                            active.insert(id, p.watched);
                            if p.done.send(Ok((generation, id))).is_err() {
                                active.remove(&id);
                                if let Some(s) = sender.as_mut() {
                                    let _ = s.cancel(id).await;
                                }
                            }
                        }
                    }
                } else if resp.canceled {
                    if let Some(w) = active.remove(&id) {
                        w.broken.store(true, Ordering::Release);
                        w.signal.fire();
                    }
                }
                if let Some(w) = active.get(&id) {
                    let gone = resp.events.iter().any(|ev| {
                        w.range
                            || ev.r#type() == EventType::Delete
                            || ev.kv.as_ref().map(|kv| kv.create_revision) != Some(w.rev)
                    });
                    if gone {
                        w.signal.fire();
                    }
                }
                false
            }
            Ev::Msg(_) => true,
        };
        if broke {
            // The stream is gone (server restart, leader loss): every waiter looks again and
            // watches anew.
            sender = None;
            stream = None;
            for (_, w) in active.drain() {
                w.broken.store(true, Ordering::Release);
                w.signal.fire();
            }
            for p in pending.drain(..) {
                let _ = p
                    .done
                    .send(Err(Error::unavailable(KIND, "watch stream broke")));
            }
        }
    }
}
