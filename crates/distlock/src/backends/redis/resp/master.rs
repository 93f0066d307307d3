//! Where a pool's new connection goes: the master the Sentinels name (checked with `ROLE`),
//! or the cluster node the slot map named (checked with `CLUSTER MYID`).

use std::io;
use std::time::Duration;

use super::conn::{open, Conn};
use super::pool::Pool;
use super::{Reply, RespError, SentinelInfo};

impl Pool {
    pub(super) async fn connect_now(&self) -> Result<Conn, RespError> {
        let info = &self.info;
        let Some(sentinel) = &info.sentinel else {
            let mut conn = self.open_at(&info.addr).await?;
            if let Some(id) = &info.node_id {
                check_node_id(&mut conn, &info.addr, id, info.connect_timeout).await?;
            }
            return Ok(conn);
        };
        let addr = self.master_addr(sentinel).await?;
        let mut conn = self.open_at(&addr).await?;
        // The Sentinels may still name a master that a failover has just demoted.
        let role = tokio::time::timeout(
            info.connect_timeout,
            conn.exchange(&[&[b"ROLE".as_slice()]]),
        )
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "ROLE timed out"))??;
        match role.first() {
            Some(Reply::Array(Some(r))) if matches!(r.first(), Some(Reply::Bulk(Some(b))) if b == b"master") =>
            {
                *self.master.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
                Ok(conn)
            }
            _ => Err(RespError::Io(io::Error::other(format!(
                "{addr}, named master by the Sentinels, is not a master (a failover is under way)"
            )))),
        }
    }

    /// Opens a connection to `addr` with the pool's credentials, database and TLS.
    async fn open_at(&self, addr: &str) -> Result<Conn, RespError> {
        let info = &self.info;
        open(
            addr,
            info.user.as_deref(),
            info.password.as_deref(),
            info.db,
            info.connect_timeout,
            info.tls.as_ref(),
        )
        .await
    }

    /// Asks the Sentinels, in turn, for the master's address.
    async fn master_addr(&self, s: &SentinelInfo) -> Result<String, RespError> {
        let mut errors = Vec::new();
        for host in &s.hosts {
            let ask = async {
                let mut conn = open(
                    host,
                    s.user.as_deref(),
                    s.password.as_deref(),
                    0,
                    self.info.connect_timeout,
                    self.info.tls.as_ref(),
                )
                .await?;
                let cmd: [&[u8]; 3] =
                    [b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", s.master.as_bytes()];
                let reply = tokio::time::timeout(self.info.connect_timeout, conn.exchange(&[cmd]))
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no reply in time"))??;
                match reply.first() {
                    Some(Reply::Array(Some(a))) => match (a.first(), a.get(1)) {
                        (Some(Reply::Bulk(Some(ip))), Some(Reply::Bulk(Some(port)))) => {
                            Ok(format!(
                                "{}:{}",
                                String::from_utf8_lossy(ip),
                                String::from_utf8_lossy(port)
                            ))
                        }
                        _ => Err(RespError::Server(format!("unexpected reply {a:?}"))),
                    },
                    Some(Reply::Array(None)) | Some(Reply::Bulk(None)) => Err(RespError::Server(
                        format!("the Sentinel does not know a master named {:?}", s.master),
                    )),
                    Some(Reply::Error(e)) => Err(RespError::Server(e.clone())),
                    r => Err(RespError::Server(format!("unexpected reply {r:?}"))),
                }
            };
            match ask.await {
                Ok(addr) => return Ok(addr),
                Err(RespError::Server(e))
                    if e.starts_with("the Sentinel does not know")
                        || e.starts_with("TLS with")
                        || e.starts_with("NOAUTH")
                        || e.starts_with("WRONGPASS") =>
                {
                    return Err(RespError::Server(format!("sentinel {host}: {e}")))
                }
                Err(e) => errors.push(format!("{host}: {e:?}")),
            }
        }
        Err(RespError::Io(io::Error::other(format!(
            "no Sentinel answered: {}",
            errors.join("; ")
        ))))
    }

    /// With Sentinel: where the Sentinels say the master is now.
    pub(crate) async fn current_master(&self) -> Result<String, RespError> {
        match &self.info.sentinel {
            Some(s) => self.master_addr(s).await,
            None => Ok(self.info.addr.clone()),
        }
    }

    /// The master the last connection went to, with Sentinel.
    pub(crate) fn master(&self) -> Option<String> {
        self.master
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Fails unless the server behind `conn` is cluster node `id`. An I/O error, so that the
/// pool reports the request unsent and the cluster client reads the slot map again.
async fn check_node_id(
    conn: &mut Conn,
    addr: &str,
    id: &str,
    timeout: Duration,
) -> Result<(), RespError> {
    let reply = tokio::time::timeout(timeout, conn.exchange(&[&[b"CLUSTER".as_slice(), b"MYID"]]))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "CLUSTER MYID timed out"))??;
    match reply.first() {
        Some(Reply::Bulk(Some(got))) if got == id.as_bytes() => Ok(()),
        r => Err(RespError::Io(io::Error::other(format!(
            "{addr} is no longer cluster node {id} (it answers CLUSTER MYID with {r:?}): the slot map is out of date"
        )))),
    }
}
