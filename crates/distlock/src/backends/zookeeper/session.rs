//! Sessions: one per session timeout (the lease of the holds in it), established on demand
//! and re-established (resumed where the ensemble still knows it) when it ends.

use super::*;

/// The session timeout that makes a session end with a lease: the lease in whole milliseconds
/// (rounded up), the unit in which ZooKeeper negotiates it.
pub(super) fn session_of_lease(lease: Duration) -> Duration {
    let ms = lease.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Fails unless the server granted `conn` a session timeout of exactly `lease`: the session
/// is the lease on the server (a holder that stops frees the lock when its session ends).
fn check_lease(conn: &Conn, lease: Duration) -> Result<()> {
    let granted = conn.client.session_timeout();
    if granted == conn.slot {
        return Ok(());
    }
    Err(Error::config(format!(
        "lease {lease:?}: the ZooKeeper server grants sessions of {granted:?} instead (it \
         allows only its minSessionTimeout..maxSessionTimeout, 2..20 tickTime by default); a \
         ZooKeeper lease is a session, so choose a lease within that range"
    )))
}

impl Inner {
    /// The slot of `timeout`. Past [`MAX_IDLE_SESSIONS`] slots, those of leases that no node
    /// of this backend uses any more are closed first, so that many distinct leases over time
    /// do not keep a session (and a connection) each.
    pub(super) fn slot(&self, timeout: Duration) -> Arc<Slot> {
        let full = {
            let sessions = self.sessions.locked();
            if let Some(s) = sessions.get(&timeout) {
                return s.clone();
            }
            sessions.len() >= MAX_IDLE_SESSIONS
        };
        // Never both locks at once: the nodes' lock is taken first elsewhere.
        let used: HashSet<Duration> = if full {
            self.nodes.lock().values().map(|n| n.slot).collect()
        } else {
            HashSet::new()
        };
        let mut sessions = self.sessions.locked();
        if full {
            let keep = [self.options.session_timeout, self.waiter_slot(), timeout];
            sessions.retain(|k, _| keep.contains(k) || used.contains(k));
        }
        sessions.entry(timeout).or_default().clone()
    }

    pub(super) fn current(&self, timeout: Duration) -> Option<Arc<Conn>> {
        self.slot(timeout).conn.locked().clone()
    }

    /// Runs one request with the request timeout.
    pub(super) async fn timed<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T> {
        let limit = self.options.request_timeout;
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| timed_out(what, limit))
    }

    /// Establishes a session (resuming `resume`). The outer error is final: a TLS handshake
    /// that fails on every server (untrusted certificate, refused client certificate).
    pub(super) async fn open(
        &self,
        timeout: Duration,
        resume: Option<zookeeper_client::SessionInfo>,
    ) -> Result<std::result::Result<Client, zookeeper_client::Error>> {
        let mut connector = Client::connector()
            .with_session_timeout(timeout)
            .with_fail_eagerly();
        #[cfg(feature = "zookeeper-tls")]
        if let Some(tls) = &self.tls {
            connector = connector.with_tls(tls.options.clone());
        }
        if let Some(auth) = &self.auth {
            connector = connector.with_auth("digest", auth);
        }
        if let Some(s) = resume {
            connector = connector.with_session(s);
        }
        // Every host is tried once per round; while none serves (all down, or an ensemble
        // electing its leader) rounds repeat until the connect timeout.
        let limit = self.options.connect_timeout;
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(25);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.connect_once(connector.clone())).await {
                Ok(Err(zookeeper_client::Error::NoHosts)) => {
                    // Every server refused: a TLS failure will not go away by retrying.
                    if let Some(tls) = &self.tls {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if let Ok(Some(e)) =
                            tokio::time::timeout(left, tls.diagnose(&self.hosts)).await
                        {
                            return Err(e);
                        }
                    }
                    if Instant::now() + pause >= deadline {
                        return Ok(Err(zookeeper_client::Error::NoHosts));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Ok(res) => return Ok(res),
                Err(_) => return Ok(Err(zookeeper_client::Error::Timeout)),
            }
        }
    }

    /// One round over the hosts, over TLS for `zks://`.
    async fn connect_once(
        &self,
        connector: zookeeper_client::Connector,
    ) -> std::result::Result<Client, zookeeper_client::Error> {
        #[cfg(feature = "zookeeper-tls")]
        if self.tls.is_some() {
            return connector.secure_connect(&self.hosts).await;
        }
        connector.connect(&self.hosts).await
    }

    pub(super) fn connect_error(&self, e: zookeeper_client::Error) -> Error {
        let limit = self.options.connect_timeout;
        match e {
            zookeeper_client::Error::Timeout => Error::unavailable(
                KIND,
                format!("no session with {} within {limit:?}", self.hosts),
            ),
            zookeeper_client::Error::AuthFailed => {
                Error::backend(KIND, format!("authentication with {} failed", self.hosts))
            }
            e => Error::unavailable(
                KIND,
                format!("cannot establish a session with {}: {e}", self.hosts),
            ),
        }
    }

    /// The session of reads that hold nothing (`options.session_timeout`).
    pub(super) async fn conn(self: &Arc<Self>) -> Result<Arc<Conn>> {
        self.conn_for(self.options.session_timeout).await
    }

    /// The session whose timeout is `lease`, checked to be what the server granted (see
    /// [`check_lease`]): where a hold of that lease lives.
    pub(super) async fn lease_conn(self: &Arc<Self>, lease: Duration) -> Result<Arc<Conn>> {
        let conn = self.conn_for(session_of_lease(lease)).await?;
        check_lease(&conn, lease)?;
        Ok(conn)
    }

    /// The current session of `timeout`, establishing a new one when it ended. A session the
    /// client gave up on (the servers were unreachable for longer than its timeout) is resumed
    /// when the ensemble still knows it, so that its nodes stay valid.
    pub(super) async fn conn_for(self: &Arc<Self>, timeout: Duration) -> Result<Arc<Conn>> {
        let slot = self.slot(timeout);
        let current = || slot.conn.locked().clone();
        if let Some(c) = current() {
            if !c.client.state().is_terminated() {
                return Ok(c);
            }
        }
        let _single = slot.connecting.lock().await;
        let old = current();
        if let Some(c) = &old {
            if !c.client.state().is_terminated() {
                return Ok(c.clone());
            }
        }
        let recent_failure = *slot.last_connect_failure.locked();
        if recent_failure.is_some_and(|t| t.elapsed() < Duration::from_millis(250)) {
            return Err(Error::unavailable(
                KIND,
                format!("no session with {} (retrying)", self.hosts),
            ));
        }
        let res = self.reconnect(timeout, old).await;
        if let Ok(conn) = &res {
            *slot.conn.locked() = Some(conn.clone());
        }
        *slot.last_connect_failure.locked() = res.is_err().then(Instant::now);
        res
    }

    pub(super) async fn reconnect(
        self: &Arc<Self>,
        timeout: Duration,
        old: Option<Arc<Conn>>,
    ) -> Result<Arc<Conn>> {
        let resume = old
            .as_ref()
            .filter(|c| c.client.state() == SessionState::Expired)
            .map(|c| c.client.session().clone());
        let resumed = match resume {
            Some(info) => match self.open(timeout, Some(info)).await? {
                Ok(c) => Some(c),
                Err(zookeeper_client::Error::SessionExpired) => None,
                Err(e) => return Err(self.connect_error(e)),
            },
            None => None,
        };
        let client = match resumed {
            Some(c) => c,
            None => self
                .open(timeout, None)
                .await?
                .map_err(|e| self.connect_error(e))?,
        };
        let conn = Arc::new(Conn {
            session: client.session_id().0,
            client,
            slot: timeout,
        });
        if let Some(old) = &old {
            if old.session != conn.session {
                tracing::warn!(
                    old = format_args!("{:#x}", old.session),
                    new = format_args!("{:#x}", conn.session),
                    "ZooKeeper session expired; every lock of the old session is lost"
                );
            }
        }
        self.watch_state(&conn);
        Ok(conn)
    }

    /// Wakes every waiter on session events: after a reconnect they check their place again,
    /// after an expiry they join the queue anew.
    pub(super) fn watch_state(&self, conn: &Conn) {
        let mut states = conn.client.state_watcher();
        let signals = Arc::downgrade(&self.signals);
        tokio::spawn(async move {
            loop {
                let state = states.changed().await;
                let Some(signals) = signals.upgrade() else {
                    return;
                };
                tracing::debug!(%state, "ZooKeeper session state");
                if state != SessionState::Disconnected {
                    signals.fire_all();
                }
                if state.is_terminated() {
                    return;
                }
            }
        });
    }
}
