//! The queue of one lock on the server: key layout (`<prefix>/<key>/<lease hex>`), the ranges
//! that find the holder and the predecessor, and the reads behind them.

use crate::backend::LockName;
use std::time::Duration;

use crate::error::Result;

use super::kinds::{children, judge_exclusive, queued, Queued, Verdict};
use super::options::PEEK;
use super::pb::{self, range_request::SortOrder};
use super::rpc_error::map_err;
use super::state::Shared;
use super::watch::WatchTarget;

/// The session TTL class of a lock lease: 1.5 × the lease in whole seconds, at least `min`.
pub(super) fn class_of(lease: Duration, min: Duration) -> i64 {
    let want = lease.as_secs_f64() * 1.5;
    let secs = want.ceil().max(min.as_secs_f64().ceil()).max(1.0);
    secs.min(9e9) as i64
}

pub(super) fn lock_dir(name: &LockName) -> String {
    let mut d = String::with_capacity(name.prefix().len() + name.key().len() + 2);
    d.push_str(name.prefix());
    d.push('/');
    d.push_str(name.key());
    d.push('/');
    d
}

/// The keys directly below `dir` (not those of a lock whose key extends this one's with `/`).
pub(super) fn direct_children(dir: &[u8], kvs: &[pb::KeyValue]) -> Vec<WatchTarget> {
    children(dir, kvs, |kv| {
        WatchTarget::key(kv.key.clone(), kv.create_revision)
    })
}

/// The first contenders of `dir`, oldest first.
pub(super) fn ascending(dir: &str) -> pb::RangeRequest {
    pb::RangeRequest {
        limit: PEEK,
        ..pb::range_by_create(dir.as_bytes(), SortOrder::Ascend)
    }
}

/// The last contenders of `dir`, youngest first: right after a transaction that put a key, that
/// key and the ones just before it.
pub(super) fn newest(dir: &str) -> pb::RangeRequest {
    pb::RangeRequest {
        limit: PEEK,
        ..pb::range_by_create(dir.as_bytes(), SortOrder::Descend)
    }
}

/// The contenders of `dir` created before revision `rev`, youngest first.
pub(super) fn before(dir: &str, rev: i64) -> pb::RangeRequest {
    pb::RangeRequest {
        limit: PEEK,
        max_create_revision: rev - 1,
        ..pb::range_by_create(dir.as_bytes(), SortOrder::Descend)
    }
}

/// Every key of `dir` created before revision `rev`, oldest first, with their values (a
/// permit's number of permits is in its value).
pub(super) fn every_before(dir: &str, rev: i64) -> pb::RangeRequest {
    pb::RangeRequest {
        max_create_revision: rev - 1,
        ..with_values(pb::range_by_create(dir.as_bytes(), SortOrder::Ascend))
    }
}

/// `r` with the keys' values.
pub(super) fn with_values(r: pb::RangeRequest) -> pb::RangeRequest {
    pb::RangeRequest {
        keys_only: false,
        ..r
    }
}

impl Shared {
    /// The keys of `dir` older than `rev`, oldest first: from `asc` (the first keys of the
    /// directory) when it reaches that far, else ranged.
    pub(super) async fn before(
        &self,
        dir: &str,
        rev: i64,
        asc: Option<&pb::RangeResponse>,
    ) -> Result<Vec<Queued>> {
        let complete = asc.filter(|r| !r.more || r.kvs.iter().any(|kv| kv.create_revision >= rev));
        let kvs = match complete {
            Some(r) => r.kvs.clone(),
            None => self.range(every_before(dir, rev)).await?.kvs,
        };
        let mut all = queued(dir.as_bytes(), &kvs, false);
        all.retain(|q| q.fence < rev);
        Ok(all)
    }

    /// Every key of `name`'s directory, oldest first, read as an election's candidates when
    /// `name` is an election's.
    pub(super) async fn all_of(&self, name: &LockName) -> Result<Vec<Queued>> {
        let dir = lock_dir(name);
        let all = with_values(pb::range_by_create(dir.as_bytes(), SortOrder::Ascend));
        let kvs = self.range(all).await?.kvs;
        Ok(queued(dir.as_bytes(), &kvs, name.is_election()))
    }

    pub(super) async fn txn(&self, txn: pb::TxnRequest) -> Result<pb::TxnResponse> {
        self.client.txn(txn).await.map_err(map_err)
    }

    pub(super) async fn range(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse> {
        self.client.range(req).await.map_err(map_err)
    }

    /// Every contender of `dir`, oldest first (for queues whose head the short ranges missed).
    async fn all_contenders(&self, dir: &str) -> Result<Vec<WatchTarget>> {
        let resp = self
            .range(pb::range_by_create(dir.as_bytes(), SortOrder::Ascend))
            .await?;
        Ok(direct_children(dir.as_bytes(), &resp.kvs))
    }

    /// The verdict for the mutex's or writer's key created at `rev`, from one range of the
    /// keys before it, youngest first (`newest` right after its key was put, or `before` its
    /// revision; younger keys are skipped), and how many keys are ahead of it (exact when the
    /// range reached the oldest key, else the directory's count less one, an upper bound).
    /// Only a range that shows no older key of the directory itself but has more falls back
    /// to the whole queue. Holding needs no older key, so the oldest key (the holder) need not
    /// be ranged: one sorted range instead of two, each of which etcd serves by reading every
    /// key of the directory.
    pub(super) async fn view_behind(
        &self,
        dir: &str,
        rev: i64,
        desc: &pb::RangeResponse,
    ) -> Result<(Verdict, Option<u32>)> {
        let mut older = direct_children(dir.as_bytes(), &desc.kvs);
        older.retain(|c| c.rev < rev);
        if let Some(pred) = older.first() {
            let ahead = match desc.more {
                false => u32::try_from(older.len()).ok(),
                true => u32::try_from(desc.count.saturating_sub(1)).ok(),
            };
            return Ok((Verdict::Waits(pred.clone()), ahead));
        }
        if !desc.more {
            return Ok((Verdict::Holds, Some(0)));
        }
        let all = self.all_contenders(dir).await?;
        let at = all.iter().take_while(|c| c.rev < rev).count();
        Ok((judge_exclusive(all, rev), u32::try_from(at).ok()))
    }

    /// The verdict for the key created at `rev` from an ascending range of the oldest keys,
    /// falling back to the whole queue when it does not reach that key (a key that was there
    /// before the attempt).
    pub(super) async fn view(
        &self,
        dir: &str,
        rev: i64,
        asc: &pb::RangeResponse,
    ) -> Result<Verdict> {
        let listed = direct_children(dir.as_bytes(), &asc.kvs);
        let complete = !listed.is_empty() && (listed.iter().any(|c| c.rev >= rev) || !asc.more);
        let all = match complete {
            true => listed,
            false => self.all_contenders(dir).await?,
        };
        Ok(judge_exclusive(all, rev))
    }
}
