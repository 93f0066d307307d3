//! The listening connection: one per backend, listening on the table's channel (releases that
//! wake every waiter) and on the backend's own (a release naming the one waiter it wakes, see
//! `wait.rs`), reconnected when it drops, waking waiters on `NOTIFY`.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{oneshot, watch};
use tokio_postgres::AsyncMessage;

use super::state::{ListenerHandle, Postgres};

/// How often the listening connection is checked.
const LISTENER_CHECK: Duration = Duration::from_secs(30);

impl Postgres {
    /// Starts the listening task once.
    pub(super) fn listener(self: &Arc<Self>) -> &ListenerHandle {
        self.listener.get_or_init(|| {
            let (up_tx, up) = watch::channel(0u64);
            let (stop, stop_rx) = oneshot::channel();
            tokio::spawn(listen(Arc::downgrade(self), up_tx, stop_rx));
            ListenerHandle { up, _stop: stop }
        })
    }
}

/// Keeps one connection listening on the table's channel, reconnecting when it drops. After a
/// reconnect every waiter is woken, since releases in between were not heard.
pub(super) async fn listen(
    weak: Weak<Postgres>,
    up: watch::Sender<u64>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut generation = 0u64;
    let mut backoff = Duration::from_millis(10);
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let timeout = inner.common.options.connect_timeout;
        let request_timeout = inner.common.options.request_timeout;
        let channel_name = inner.listen_channel.clone();
        let wake_channel = inner.wake_channel.clone();
        let origin = inner.origin.clone();
        let connecting = async move {
            let refused = Arc::new(AtomicBool::new(false));
            inner.pool.manager().open(refused).await
        };
        let connected = tokio::select! {
            r = tokio::time::timeout(timeout, connecting) => r,
            _ = &mut stop => return,
        };
        let (client, mut messages) = match connected {
            Ok(Ok(pair)) => pair,
            other => {
                if let Ok(Err(e)) = other {
                    tracing::debug!(error = %e, "postgres listener cannot connect; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = &mut stop => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let deliver_to = weak.clone();
        let prefix = format!("{origin}:");
        let own = wake_channel.clone();
        let mut driver = tokio::spawn(async move {
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        let Some(inner) = deliver_to.upgrade() else {
                            return;
                        };
                        let payload = n.payload();
                        tracing::trace!(target: "distlock::probe",
                            ev = if n.channel() == own { "pg_own" } else { "pg_table" });
                        if n.channel() == own {
                            // A release named one of our waiters as the next (ours included).
                            inner.woken(payload);
                        } else if !payload.starts_with(&prefix) {
                            // Our own releases fired their local signal already.
                            if let Some((_, ch)) = payload.split_once(':') {
                                inner.common.signals.fire(ch);
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "postgres listener connection ended");
                        return;
                    }
                }
            }
        });
        let statement = format!("LISTEN \"{channel_name}\"; LISTEN \"{wake_channel}\"");
        match tokio::time::timeout(request_timeout, client.batch_execute(&statement)).await {
            Ok(Ok(())) => {}
            other => {
                if let Ok(Err(e)) = other {
                    tracing::debug!(error = %e, "LISTEN failed; reconnecting");
                }
                driver.abort();
                continue;
            }
        }
        backoff = Duration::from_millis(10);
        generation += 1;
        let _ = up.send(generation);
        if generation > 1 {
            if let Some(inner) = weak.upgrade() {
                inner.common.signals.fire_all();
            }
        }
        // A silent connection (a stalled network, a dead server) is noticed by a periodic
        // query, since releases in between would otherwise go unheard.
        let mut check = tokio::time::interval(LISTENER_CHECK);
        check.tick().await;
        loop {
            tokio::select! {
                _ = &mut driver => break,
                _ = &mut stop => { driver.abort(); return; }
                _ = check.tick() => {
                    let alive = tokio::time::timeout(request_timeout, client.simple_query("SELECT 1"));
                    if !matches!(alive.await, Ok(Ok(_))) {
                        tracing::debug!("postgres listener connection is silent; reconnecting");
                        driver.abort();
                        break;
                    }
                }
            }
        }
        drop(client);
        let _ = up.send(0);
    }
}
