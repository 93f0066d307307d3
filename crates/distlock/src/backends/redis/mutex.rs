//! The mutex attempts: the uncontended `SET NX PX` with its fence, the scripted attempt that
//! queues, and the take of a reservation (see `RedisOptions::hold_slice`).

use std::time::Duration;

use super::keys::sibling_key;
use super::resp::Reply;
use super::scripts::{Lua, FENCE_SEED};
use super::transport::server_err;
use super::{ms, RedisBackend, KIND};
use crate::backend::{AcquireMode, Attempt, Token};
use crate::error::{Error, Result};

impl RedisBackend {
    /// The scripted attempt: joins the wait queue in [`AcquireMode::Queue`], takes over a lock
    /// already held with `token`, seeds the fence counter. Without `fifo` (Redlock) the queue
    /// only tells readers that an exclusive waiter waits.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn acquire_script(
        &self,
        key: &str,
        fence_key: &str,
        token: Token,
        hex: &[u8],
        lease_ms: &str,
        mode: AcquireMode,
        fifo: bool,
        owner: &str,
    ) -> Result<Attempt> {
        let waiter_ttl_ms = match mode {
            AcquireMode::Try => 0,
            AcquireMode::Queue => self.waiter_ttl_ms,
        };
        let (queue, waiters) = Self::queue_keys(key);
        let member = self.member(token);
        let ttl = waiter_ttl_ms.to_string();
        let owners = sibling_key(key, "owners");
        let args: &[&[u8]] = &[
            hex,
            lease_ms.as_bytes(),
            ttl.as_bytes(),
            &member,
            owner.as_bytes(),
            b"0",
        ];
        let reply = self
            .eval_replicated(
                &self.scripts.acquire,
                &[key, fence_key, &queue, &waiters, &owners],
                if fifo { &args[..5] } else { args },
            )
            .await?;
        match reply.ints().as_deref() {
            Some(&[1, fence]) => {
                // A hand-over whose message came while this attempt ran is superseded by it.
                self.grants.forget(&token.to_hex_bytes());
                let fence = u64::try_from(fence)
                    .map_err(|_| Error::backend(KIND, format!("fence {fence} is negative")))?;
                Ok(Attempt::Acquired { fence })
            }
            Some(&[0, pttl, floor, ref rank @ ..]) if rank.len() <= 1 => {
                self.contended.mark(key);
                if fifo && mode == AcquireMode::Queue {
                    self.grants_busy(&token.to_hex_bytes(), floor);
                }
                // PTTL -1: a foreign client set the key without expiry; -2: free, but others
                // are queued first (or it just vanished).
                let retry_after = u64::try_from(pttl).ok().map(Duration::from_millis);
                Ok(self.queued_busy(retry_after, rank.first().copied(), fifo))
            }
            _ => Err(Error::backend(KIND, format!("unexpected reply {reply:?}"))),
        }
    }

    /// A mutex attempt on `key`: the pipelined `SET NX PX` and fence for a try, unless the
    /// key is reserved for this backend (see [`RedisOptions::hold_slice`]), which `TAKE`
    /// takes; else the script. An acquisition of a contended key begins or continues a slice.
    ///
    /// [`RedisOptions::hold_slice`]: super::RedisOptions::hold_slice
    pub(super) async fn acquire_mutex(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
        mode: AcquireMode,
        owner: &str,
    ) -> Result<Attempt> {
        let seen = self.contended.attempting(key, self.hold_slice);
        let reserved = seen == Some(true);
        if reserved {
            if let Some(fence) = self.take_reserved(key, token, lease, owner).await? {
                self.contended.acquired(key, self.hold_slice, true);
                return Ok(Attempt::Acquired { fence });
            }
        }
        let attempt = self
            .attempt_mutex(key, token, lease, mode, reserved, owner)
            .await;
        // A key not seen contended has no slice to begin.
        if let (Ok(Attempt::Acquired { .. }), Some(_)) = (&attempt, seen) {
            self.contended.acquired(key, self.hold_slice, false);
        }
        attempt
    }

    /// Takes the key reserved for this backend: its fence, or `None` when the reservation is
    /// gone.
    pub(super) async fn take_reserved(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
        owner: &str,
    ) -> Result<Option<u64>> {
        let (hex, lease_ms) = (token.to_hex_bytes(), ms(lease).to_string());
        let member = self.member(token);
        let args: &[&[u8]] = &[
            self.reservation.as_bytes(),
            &hex,
            lease_ms.as_bytes(),
            &member,
            owner.as_bytes(),
        ];
        let fence_key = sibling_key(key, "fence");
        let owners = sibling_key(key, "owners");
        let (queue, waiters) = Self::queue_keys(key);
        let reply = self
            .eval_replicated(
                &self.scripts.take,
                &[key, &fence_key, &queue, &waiters, &owners],
                args,
            )
            .await?;
        let Some(&[1, fence]) = reply.ints().as_deref() else {
            return Ok(None);
        };
        self.grants.forget(&hex);
        u64::try_from(fence)
            .map(Some)
            .map_err(|_| Error::backend(KIND, format!("fence {fence} is negative")))
    }

    /// A mutex attempt without a reservation to take: see [`Self::acquire_mutex`].
    pub(super) async fn attempt_mutex(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
        mode: AcquireMode,
        reserved: bool,
        owner: &str,
    ) -> Result<Attempt> {
        let fence_key = sibling_key(key, "fence");
        let owners = sibling_key(key, "owners");
        let hex = token.to_hex_bytes();
        let lease_ms = ms(lease).to_string();
        // A reservation gone meanwhile (taken over at the end of the slice) is for the script.
        if mode == AcquireMode::Try && !reserved {
            let set: &[&[u8]] = &[
                b"SET",
                key.as_bytes(),
                &hex,
                b"NX",
                b"PX",
                lease_ms.as_bytes(),
            ];
            let lua = &self.scripts.fence_held;
            let incr: &[&[u8]] = &[
                b"EVALSHA",
                lua.sha.as_bytes(),
                b"3",
                key.as_bytes(),
                fence_key.as_bytes(),
                owners.as_bytes(),
                &hex,
                owner.as_bytes(),
                lease_ms.as_bytes(),
            ];
            // On Cluster the fence is asked for only once the `SET` won: while the slot
            // migrates, the two keys can be on different nodes, which a busy attempt would
            // otherwise meet as `TRYAGAIN` (the `WAIT` after the script also covers the `SET`,
            // earlier in the master's replication stream).
            if self.cluster.is_some() {
                match self.request(set).await? {
                    Reply::Bulk(None) => {
                        self.contended.mark(key);
                        return Ok(Attempt::BUSY);
                    }
                    Reply::Simple(_) => {}
                    Reply::Error(e) => return Err(server_err(e)),
                    r => return Err(Error::backend(KIND, format!("unexpected reply {r:?}"))),
                }
            } else {
                let (replies, acked) = self.pipeline_then_wait(&[set, incr], true).await?;
                // Checked only once taken: a busy attempt wrote nothing that matters.
                if matches!(replies.first(), Some(Reply::Simple(_))) {
                    self.check_replicated(acked)?;
                }
                match <[Reply; 2]>::try_from(replies) {
                    Ok([Reply::Bulk(None), _]) => {
                        self.contended.mark(key);
                        return Ok(Attempt::BUSY);
                    }
                    Ok([Reply::Simple(_), Reply::Int(f)]) if f >= FENCE_SEED => {
                        return Ok(Attempt::Acquired { fence: f as u64 })
                    }
                    // Taken, but the node does not know the fence script yet: `eval` loads it
                    // by `EVAL` for next time. The lock is ours meanwhile.
                    Ok([Reply::Simple(_), Reply::Error(e)]) if e.starts_with("NOSCRIPT") => {}
                    // The `redis` crate's connection (TLS) reports a pipeline with an error
                    // reply as that error for every command: the `SET` ran, but whether it won
                    // is unknown. The fence script below takes a fence only if it did, and the
                    // full script decides otherwise.
                    Ok([Reply::Error(a), Reply::Error(b)])
                        if a.starts_with("NOSCRIPT") && b.starts_with("NOSCRIPT") => {}
                    // Taken and already lost (a lease shorter than the round trip): the
                    // script below decides.
                    Ok([Reply::Simple(_), Reply::Int(_)]) => {}
                    Ok([Reply::Error(e), _] | [_, Reply::Error(e)]) => return Err(server_err(e)),
                    r => return Err(Error::backend(KIND, format!("unexpected replies {r:?}"))),
                }
            }
            let f = self
                .eval_owned(
                    (lua, &[key, &fence_key], &owners),
                    &self.scripts.own,
                    &[&hex, owner.as_bytes(), lease_ms.as_bytes()],
                    1,
                )
                .await?;
            if let Some(f) = f.int().filter(|f| *f >= FENCE_SEED) {
                return Ok(Attempt::Acquired { fence: f as u64 });
            }
        }
        self.acquire_script(key, &fence_key, token, &hex, &lease_ms, mode, true, owner)
            .await
    }

    /// Runs `lua` (a mutex script that takes the owners hash as its last key, optionally) on
    /// `keys` with `args`, with the holder's description kept in `owners`: elsewhere the
    /// owners key goes with the script (one atomic call); on Redis Cluster the script runs on
    /// `keys` with the first `cluster_args` of `args` and `own` (one key: `owners`, with all
    /// of `args`) follows it in the same pipeline, so that no script names a key that may be
    /// missing while the slot migrates (see `scripts::OWN`). The script's reply.
    pub(super) async fn eval_owned(
        &self,
        (lua, keys, owners): (&Lua, &[&str], &str),
        own: &Lua,
        args: &[&[u8]],
        cluster_args: usize,
    ) -> Result<Reply> {
        if self.cluster.is_none() {
            let mut all = keys.to_vec();
            all.push(owners);
            return self.eval_replicated(lua, &all, args).await;
        }
        let mut first: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        first.extend_from_slice(&args[..cluster_args]);
        let mut second: Vec<&[u8]> = vec![owners.as_bytes()];
        second.extend_from_slice(args);
        let calls = [(lua, first, keys.len()), (own, second, 1)];
        match self.eval_pipeline(&calls, true).await?.into_iter().next() {
            Some(Reply::Error(e)) => Err(server_err(e)),
            Some(r) => Ok(r),
            None => Err(Error::unavailable(KIND, "missing reply")),
        }
    }

    /// A busy reply for a token with a place in the queue at `rank` (0: the head; Redlock's
    /// places have no head rule, so no rank counts there). A release wakes the head in turn
    /// (its wake channel), so the waiters behind it poll only against a lost message and to
    /// keep their places, which last `waiter_ttl` unless renewed: their polls are spread by
    /// their place, but come back within half the waiter ttl.
    fn queued_busy(&self, retry_after: Option<Duration>, rank: Option<i64>, fifo: bool) -> Attempt {
        let Some(rank) = rank.filter(|r| fifo && *r >= 0) else {
            return Attempt::Busy {
                retry_after,
                ahead: None,
            };
        };
        let keep_place = Duration::from_millis(self.waiter_ttl_ms / 2);
        Attempt::Busy {
            retry_after: Some(retry_after.map_or(keep_place, |r| r.min(keep_place))),
            ahead: u32::try_from(rank + 1).ok(),
        }
    }

    /// Records what a busy queued attempt saw of the fence counter (see
    /// [`Grants`](super::notify::Grants)), where this backend takes grants at all.
    pub(super) fn grants_busy(&self, token: &[u8; 32], floor: i64) {
        if self.replicas.get() == 0 {
            self.grants.busy(*token, u64::try_from(floor).unwrap_or(0));
        }
    }
}
