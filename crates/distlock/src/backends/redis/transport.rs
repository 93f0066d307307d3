//! How requests reach the server: the built-in RESP client's pool for plain `redis://`, the
//! `redis` crate's multiplexed connection for `rediss://`, scripts by SHA, and the mapping of
//! errors to [`Error`] classes.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, RedisError, Value};

use super::resp::{Reply, RespError};
use super::scripts::Lua;
use super::{RedisBackend, RedisOptions, KIND, MAX_CONNECTIONS};
use crate::error::{Error, Result};
use crate::url::{Params, RawUrl, UserInfo};

pub(super) fn map_err(e: RedisError) -> Error {
    let text = e.to_string();
    if e.kind() == ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("NOPERM")
    {
        return Error::backend(KIND, format!("authentication or permission failed: {text}"));
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || text.contains("LOADING")
        || text.contains("BUSY")
        || text.contains("TRYAGAIN")
        || text.contains("MASTERDOWN")
    {
        return Error::unavailable(KIND, text);
    }
    Error::backend(KIND, text)
}

/// Maps an error reply of the server.
pub(super) fn server_err(text: String) -> Error {
    if text.starts_with("WRONGPASS") || text.starts_with("NOAUTH") || text.starts_with("NOPERM") {
        return Error::backend(KIND, format!("authentication or permission failed: {text}"));
    }
    if [
        "LOADING",
        "BUSY",
        "TRYAGAIN",
        "MASTERDOWN",
        "READONLY",
        "CLUSTERDOWN",
        super::resp::MAX_CLIENTS,
    ]
    .iter()
    .any(|p| text.starts_with(p))
    {
        return Error::unavailable(KIND, text);
    }
    Error::backend(KIND, text)
}

pub(super) fn resp_err(e: RespError) -> Error {
    match e {
        RespError::Io(e) | RespError::Unsent(e) => Error::unavailable(KIND, e.to_string()),
        RespError::Server(text) => server_err(text),
    }
}

pub(super) fn from_value(v: Value) -> Reply {
    match v {
        Value::Int(n) => Reply::Int(n),
        Value::Nil => Reply::Bulk(None),
        Value::BulkString(b) => Reply::Bulk(Some(b)),
        Value::SimpleString(s) => Reply::Simple(s),
        Value::Okay => Reply::Simple("OK".into()),
        Value::Array(items) => Reply::Array(Some(items.into_iter().map(from_value).collect())),
        Value::ServerError(e) => Reply::Error(format!("{e:?}")),
        other => Reply::Error(format!("unexpected reply {other:?}")),
    }
}

/// The `EVALSHA` (or, `by_body`, `EVAL`) commands of `calls` (script, keys then arguments,
/// how many are keys), `counts` being those numbers as text.
fn script_cmds<'a>(
    calls: &'a [(&Lua, Vec<&[u8]>, usize)],
    counts: &'a [String],
    by_body: bool,
) -> Vec<Vec<&'a [u8]>> {
    calls
        .iter()
        .zip(counts)
        .map(|((lua, rest, _), n)| {
            let mut cmd: Vec<&[u8]> = Vec::with_capacity(3 + rest.len());
            if by_body {
                cmd.extend([b"EVAL".as_slice(), lua.body.as_bytes()]);
            } else {
                cmd.extend([b"EVALSHA".as_slice(), lua.sha.as_bytes()]);
            }
            cmd.push(n.as_bytes());
            cmd.extend_from_slice(rest);
            cmd
        })
        .collect()
}

impl RedisBackend {
    pub(super) async fn connection(&self) -> Result<MultiplexedConnection> {
        if let Some(c) = self.conn.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Ok(c.clone());
        }
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(map_err)?;
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Sends several commands in one round trip; returns their replies in order (error
    /// replies included). A broken connection is dropped so that the next call reconnects.
    pub(super) async fn pipeline(&self, cmds: Vec<Vec<Vec<u8>>>) -> Result<Vec<Reply>> {
        if let Some(cluster) = &self.cluster {
            let args: Vec<Vec<&[u8]>> = cmds
                .iter()
                .map(|c| c.iter().map(Vec::as_slice).collect())
                .collect();
            let refs: Vec<&[&[u8]]> = args.iter().map(Vec::as_slice).collect();
            return Ok(cluster.run(&refs, None).await?.0);
        }
        if let Some(pool) = &self.pool {
            let refs: Vec<Vec<&[u8]>> = cmds
                .iter()
                .map(|c| c.iter().map(Vec::as_slice).collect())
                .collect();
            return pool.pipeline(&refs).await.map_err(|e| {
                pool.clear();
                resp_err(e)
            });
        }
        let mut con = self.connection().await?;
        let mut pipe = redis::pipe();
        for c in &cmds {
            let mut cmd = redis::cmd(&String::from_utf8_lossy(&c[0]));
            for a in &c[1..] {
                cmd.arg(a.as_slice());
            }
            pipe.add_command(cmd);
        }
        match pipe.query_async::<Vec<Value>>(&mut con).await {
            Ok(v) => Ok(v.into_iter().map(from_value).collect()),
            Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) => Ok(cmds
                .iter()
                .map(|_| Reply::Error("NOSCRIPT".into()))
                .collect()),
            Err(e) => {
                if e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error()
                    || e.is_timeout()
                {
                    *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
                Err(map_err(e))
            }
        }
    }

    pub(super) async fn command(&self, cmd: Vec<Vec<u8>>) -> Result<Reply> {
        let mut replies = self.pipeline(vec![cmd]).await?;
        replies
            .pop()
            .ok_or_else(|| Error::unavailable(KIND, "missing reply"))
    }

    /// Runs `lua` by its SHA, loading it by EVAL when the server lost its script cache (after
    /// a restart). An error reply becomes an error.
    pub(super) async fn eval(&self, lua: &Lua, keys: &[&str], args: &[&[u8]]) -> Result<Reply> {
        self.eval_then(lua, keys, args, false).await
    }

    /// [`Self::eval`] for a script whose writes must reach `min_replicas` replicas before it
    /// counts (Sentinel): `WAIT` follows it on the same connection, in the same round trip.
    pub(super) async fn eval_replicated(
        &self,
        lua: &Lua,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Reply> {
        self.eval_then(lua, keys, args, true).await
    }

    async fn eval_then(
        &self,
        lua: &Lua,
        keys: &[&str],
        args: &[&[u8]],
        replicated: bool,
    ) -> Result<Reply> {
        let nkeys = keys.len().to_string();
        let mut cmd: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
        cmd.extend([b"EVALSHA".as_slice(), lua.sha.as_bytes(), nkeys.as_bytes()]);
        cmd.extend(keys.iter().map(|k| k.as_bytes()));
        cmd.extend_from_slice(args);
        let (mut replies, mut acked) = self.pipeline_then_wait(&[&cmd], replicated).await?;
        if matches!(replies.first(), Some(Reply::Error(e)) if e.starts_with("NOSCRIPT")) {
            cmd[0] = b"EVAL";
            cmd[1] = lua.body.as_bytes();
            (replies, acked) = self.pipeline_then_wait(&[&cmd], replicated).await?;
        }
        self.check_replicated(acked)?;
        match replies.into_iter().next() {
            Some(Reply::Error(e)) => Err(server_err(e)),
            Some(r) => Ok(r),
            None => Err(Error::unavailable(KIND, "missing reply")),
        }
    }

    /// Runs several scripts in one pipeline: each call is a script, its keys then its
    /// arguments, and how many of those are keys. Sent by SHA; when the server answers
    /// `NOSCRIPT` to any (it lost its script cache), all are sent once more by body. Replies
    /// come back in order, error replies included; with `replicated`, `WAIT` follows as in
    /// [`Self::pipeline_then_wait`].
    pub(super) async fn eval_pipeline(
        &self,
        calls: &[(&Lua, Vec<&[u8]>, usize)],
        replicated: bool,
    ) -> Result<Vec<Reply>> {
        let counts: Vec<String> = calls.iter().map(|c| c.2.to_string()).collect();
        let build = |by_body: bool| script_cmds(calls, &counts, by_body);
        let cmds = build(false);
        let refs: Vec<&[&[u8]]> = cmds.iter().map(Vec::as_slice).collect();
        let (mut replies, mut acked) = self.pipeline_then_wait(&refs, replicated).await?;
        if replies
            .iter()
            .any(|r| matches!(r, Reply::Error(e) if e.starts_with("NOSCRIPT")))
        {
            let cmds = build(true);
            let refs: Vec<&[&[u8]]> = cmds.iter().map(Vec::as_slice).collect();
            (replies, acked) = self.pipeline_then_wait(&refs, replicated).await?;
        }
        self.check_replicated(acked)?;
        Ok(replies)
    }

    /// [`Self::eval_pipeline`] for scripts that write nothing that must be replicated (no
    /// `WAIT`) and may be of different hash slots: on Redis Cluster each goes to the master of
    /// its slot (see `Cluster::run_each`), and only those a node answered `NOSCRIPT` go again by
    /// body; elsewhere all go in one pipeline.
    pub(super) async fn eval_each(
        &self,
        calls: &[(&Lua, Vec<&[u8]>, usize)],
    ) -> Result<Vec<Reply>> {
        let Some(cluster) = &self.cluster else {
            return self.eval_pipeline(calls, false).await;
        };
        let counts: Vec<String> = calls.iter().map(|c| c.2.to_string()).collect();
        let cmds = script_cmds(calls, &counts, false);
        let refs: Vec<&[&[u8]]> = cmds.iter().map(Vec::as_slice).collect();
        let mut replies = cluster.run_each(&refs).await?;
        let unknown: Vec<usize> = (0..replies.len())
            .filter(|&i| matches!(&replies[i], Reply::Error(e) if e.starts_with("NOSCRIPT")))
            .collect();
        if !unknown.is_empty() {
            let bodies = script_cmds(calls, &counts, true);
            let refs: Vec<&[&[u8]]> = unknown.iter().map(|&i| bodies[i].as_slice()).collect();
            for (i, reply) in unknown.into_iter().zip(cluster.run_each(&refs).await?) {
                replies[i] = reply;
            }
        }
        Ok(replies)
    }

    /// Sends `cmds` in one pipeline. With `replicated` and `min_replicas` (Sentinel, Cluster),
    /// `WAIT <min_replicas> <timeout>` follows on the same connection, and its reply comes
    /// back apart, for [`Self::check_replicated`]; otherwise nothing is added. On Redis Cluster
    /// a redirected part of the pipeline gets its own `WAIT` on its node (the smallest reply
    /// counts).
    pub(super) async fn pipeline_then_wait(
        &self,
        cmds: &[&[&[u8]]],
        replicated: bool,
    ) -> Result<(Vec<Reply>, Option<Reply>)> {
        let n = if replicated {
            self.replicas_in_force().await
        } else {
            0
        };
        if n == 0 {
            return Ok((self.pipeline_refs(cmds).await?, None));
        }
        let (n, timeout) = (n.to_string(), self.replica_timeout_ms.to_string());
        let wait: &[&[u8]] = &[b"WAIT", n.as_bytes(), timeout.as_bytes()];
        if let Some(cluster) = &self.cluster {
            return cluster.run(cmds, Some(wait)).await;
        }
        let mut all = cmds.to_vec();
        all.push(wait);
        let mut replies = self.pipeline_refs(&all).await?;
        let acked = replies.pop();
        Ok((replies, acked))
    }

    /// Fails unless the reply of a `WAIT` counts at least `min_replicas` replicas; `None` (no
    /// `WAIT` was sent) passes.
    pub(super) fn check_replicated(&self, reply: Option<Reply>) -> Result<()> {
        match reply {
            Some(Reply::Int(n)) if n >= i64::from(self.replicas.get()) => Ok(()),
            Some(Reply::Int(n)) => Err(Error::unavailable(
                KIND,
                format!(
                    "only {n} of the {} replicas asked for acknowledged the write within {} ms (min_replicas)",
                    self.replicas.get(), self.replica_timeout_ms
                ),
            )),
            Some(Reply::Error(e)) => Err(server_err(e)),
            None => Ok(()),
            r => Err(Error::backend(KIND, format!("unexpected WAIT reply {r:?}"))),
        }
    }

    /// One command on the lock path's connection.
    pub(super) async fn request(&self, cmd: &[&[u8]]) -> Result<Reply> {
        self.pipeline_refs(&[cmd])
            .await?
            .pop()
            .ok_or_else(|| Error::unavailable(KIND, "missing reply"))
    }

    /// [`Self::pipeline`] without copying the arguments on the built-in client's path.
    pub(super) async fn pipeline_refs(&self, cmds: &[&[&[u8]]]) -> Result<Vec<Reply>> {
        if let Some(cluster) = &self.cluster {
            return Ok(cluster.run(cmds, None).await?.0);
        }
        if let Some(pool) = &self.pool {
            let mut replies = Vec::new();
            for _ in 0..2 {
                replies = pool.pipeline(cmds).await.map_err(|e| {
                    pool.clear();
                    resp_err(e)
                })?;
                // A master demoted by a failover refuses writes with READONLY, so nothing was
                // done: reconnect (with Sentinel, to the new master) and send it once more.
                if !replies
                    .iter()
                    .any(|r| matches!(r, Reply::Error(e) if e.starts_with("READONLY")))
                {
                    break;
                }
                pool.clear();
            }
            return Ok(replies);
        }
        let owned = cmds
            .iter()
            .map(|c| c.iter().map(|a| a.to_vec()).collect())
            .collect();
        self.pipeline(owned).await
    }
}

/// Refuses a URL whose password would cross the network in clear: with a password, plain TCP
/// needs `allow_insecure_auth=true` (secure by default, as every backend). `what` names the URL.
pub(super) fn refuse_clear_password(
    what: &str,
    tls: bool,
    password: bool,
    allowed: bool,
) -> Result<()> {
    if password && !tls && !allowed {
        return Err(Error::config(format!(
            "{what}: the password would cross the network in clear; use TLS (the rediss scheme), \
             or add allow_insecure_auth=true to send it anyway"
        )));
    }
    Ok(())
}

/// Whether user info as written in a URL (`user:pass`, `:pass`, `user`) carries a password.
pub(super) fn has_password(userinfo: Option<&str>) -> bool {
    userinfo
        .and_then(|u| u.split_once(':'))
        .is_some_and(|(_, p)| !p.is_empty())
}

/// The scheme of a `redis+<topology>://` or `rediss+<topology>://` URL, lower-cased, and
/// whether it asks for TLS; any other scheme is an error naming both.
pub(super) fn topology_scheme(
    scheme: &str,
    topology: &str,
) -> std::result::Result<(String, bool), String> {
    let scheme = scheme.to_ascii_lowercase();
    match scheme
        .strip_suffix(topology)
        .and_then(|s| s.strip_suffix('+'))
    {
        Some("redis") => Ok((scheme, false)),
        Some("rediss") => Ok((scheme, true)),
        _ => Err(format!(
            "scheme {scheme:?}: expected redis+{topology}, or rediss+{topology} for TLS"
        )),
    }
}

/// How Sentinel and Cluster reach one node, for the built-in client and for the `redis`
/// crate's pub/sub connections: the credentials of the URL and, for `rediss+sentinel://` and
/// `rediss+cluster://`, TLS verified against `ca_file` (else the Mozilla roots).
#[derive(Clone, Default)]
pub(super) struct NodeAccess {
    /// `user:pass@` as written in the URL (still percent-encoded), or empty.
    pub(super) userinfo: String,
    /// With TLS: the built-in client's set-up and the CA's PEM (if given) for the `redis` crate.
    pub(super) tls: Option<(super::resp::Tls, Option<Vec<u8>>)>,
}

impl NodeAccess {
    /// Reads `ca_file` (only with `tls`) and sets TLS up; `what` names the URL in errors.
    pub(super) fn new(
        what: &str,
        userinfo: Option<&str>,
        tls: bool,
        ca_file: Option<String>,
    ) -> Result<NodeAccess> {
        let tls = match (tls, ca_file) {
            (false, Some(_)) => {
                return Err(Error::config(format!(
                    "{what}: ca_file needs TLS (the rediss+ scheme)"
                )))
            }
            (false, None) => None,
            (true, ca_file) => {
                let pem = ca_file
                    .map(|path| {
                        std::fs::read(&path).map_err(|e| {
                            Error::config(format!("{what}: ca_file {path:?} cannot be read: {e}"))
                        })
                    })
                    .transpose()?;
                let setup = super::resp::Tls::new(pem.as_deref())
                    .map_err(|e| Error::config(format!("{what}: ca_file: {e}")))?;
                #[cfg(feature = "zookeeper-tls")]
                crate::tls::ensure_default_provider();
                Some((setup, pem))
            }
        };
        Ok(NodeAccess {
            userinfo: userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
            tls,
        })
    }

    /// The built-in client's TLS set-up, if any.
    pub(super) fn resp_tls(&self) -> Option<super::resp::Tls> {
        self.tls.as_ref().map(|(t, _)| t.clone())
    }

    /// A `redis` crate client for the node at `addr` (`host:port`), database `db`.
    pub(super) fn client(&self, addr: &str, db: u16) -> Result<redis::Client> {
        let bad = |e: RedisError| Error::backend(KIND, format!("node address {addr}: {e}"));
        match &self.tls {
            None => redis::Client::open(format!("redis://{}{addr}/{db}", self.userinfo)),
            Some((_, pem)) => {
                let url = format!("rediss://{}{addr}/{db}", self.userinfo);
                match pem {
                    None => redis::Client::open(url),
                    Some(pem) => redis::Client::build_with_tls(
                        url,
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(pem.clone()),
                        },
                    ),
                }
            }
        }
        .map_err(bad)
    }
}

/// What `redis+cluster://` and `redis+sentinel://` URLs have in common, read in the order both
/// always took their parameters: the user and the shared replica parameters first
/// ([`TopologyUrl::read`]), then the topology's own from `params`, then the shared tail
/// ([`TopologyUrl::finish`]).
pub(super) struct TopologyUrl<'k> {
    /// The data nodes' user (`None` when the URL names none or an empty one).
    pub(super) user: Option<String>,
    /// The data nodes' password.
    pub(super) password: Option<String>,
    /// `min_replicas`: the replicas a write waits for (`None`: as many as are connected).
    pub(super) min_replicas: Option<u32>,
    /// `replica_timeout`: how long a write waits for them (1 s by default).
    pub(super) replica_timeout: Duration,
    /// The parameters not read yet.
    pub(super) params: Params<'k>,
}

impl<'k> TopologyUrl<'k> {
    /// Reads the user info and the shared replica parameters; `kind` names the URL's kind in
    /// parameter errors, `bad` turns a user-info error into the URL's error.
    pub(super) fn read(
        kind: &'k str,
        raw: &RawUrl<'_>,
        bad: impl Fn(String) -> Error,
    ) -> Result<Self> {
        let user = raw
            .userinfo
            .map(|u| UserInfo::parse_any_user(u, crate::url::Decode::Lenient))
            .transpose()
            .map_err(bad)?;
        let mut params = Params::form(kind, raw.query).unique()?;
        let min_replicas = params.integer::<u32>("min_replicas")?;
        let replica_timeout = params
            .duration("replica_timeout")?
            .unwrap_or(Duration::from_secs(1));
        let (user, password) = match user {
            Some(u) => (Some(u.user).filter(|u| !u.is_empty()), u.password),
            None => (None, None),
        };
        Ok(TopologyUrl {
            user,
            password,
            min_replicas,
            replica_timeout,
            params,
        })
    }

    /// Reads `ca_file`, `allow_insecure_auth` and `hold_slice` (into `options`), refuses any
    /// parameter but the shared ones and the topology's `own`, refuses a password in clear
    /// (`password`: whether the URL carries one) and sets up how nodes are reached. `what`
    /// names the URL in errors.
    pub(super) fn finish(
        mut self,
        own: &[&str],
        what: &str,
        raw: &RawUrl<'_>,
        tls: bool,
        password: bool,
        options: &mut RedisOptions,
    ) -> Result<NodeAccess> {
        let ca_file = self.params.string("ca_file");
        let allow_insecure_auth = self.params.bool("allow_insecure_auth")?.unwrap_or(false);
        if let Some(slice) = self.params.duration("hold_slice")? {
            options.hold_slice = slice;
        }
        let mut known = vec!["min_replicas", "replica_timeout"];
        known.extend_from_slice(own);
        known.extend_from_slice(&["ca_file", "allow_insecure_auth", "hold_slice"]);
        self.params.finish(&known)?;
        refuse_clear_password(
            what,
            tls,
            password,
            allow_insecure_auth || options.allow_insecure_auth,
        )?;
        NodeAccess::new(what, raw.userinfo, tls, ca_file)
    }
}

/// The `max_connections` parameter of the URL `base`: a number (from 1 to [`MAX_CONNECTIONS`],
/// checked with the other options), on `redis://` only (`rediss://` has no pool to bound).
pub(super) fn parse_max_connections(base: &str, value: &str) -> Result<usize> {
    if !base
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("redis://"))
    {
        return Err(Error::config(
            "redis max_connections: only redis:// has a pool of connections to bound (rediss:// \
             shares one multiplexed connection)",
        ));
    }
    // The range is checked with the other options, for a value set in code too.
    value.parse::<usize>().map_err(|_| {
        Error::config(format!(
            "redis max_connections {}: expected a number from 1 to {MAX_CONNECTIONS}",
            crate::ShortKey(value)
        ))
    })
}
