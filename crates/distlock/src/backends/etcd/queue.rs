//! The queue of one lock on the server: key layout (`<prefix>/<key>/<lease hex>`), the ranges
//! that find the holder and the predecessor, and the reads behind them.

use crate::backend::LockName;
use std::time::Duration;

use crate::error::Result;

use super::kinds::{children, queued, Queued};
use super::options::PEEK;
use super::pb::{self, range_request::SortOrder};
use super::rpc_error::map_err;
use super::state::{Contender, Shared, View};

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
pub(super) fn direct_children(dir: &[u8], kvs: &[pb::KeyValue]) -> Vec<Contender> {
    children(dir, kvs, |kv| Contender {
        key: kv.key.clone(),
        rev: kv.create_revision,
        lease: kv.lease,
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
        let mut all = queued(dir.as_bytes(), &kvs);
        all.retain(|q| q.rev < rev);
        Ok(all)
    }

    /// Every key of `dir`, oldest first.
    pub(super) async fn all_queued(&self, dir: &str) -> Result<Vec<Queued>> {
        let resp = self
            .range(with_values(pb::range_by_create(
                dir.as_bytes(),
                SortOrder::Ascend,
            )))
            .await?;
        Ok(queued(dir.as_bytes(), &resp.kvs))
    }

    /// Every key of `name`'s directory, oldest first, read as an election's candidates when
    /// `name` is an election's.
    pub(super) async fn all_of(&self, name: &LockName) -> Result<Vec<Queued>> {
        if !name.is_election() {
            return self.all_queued(&lock_dir(name)).await;
        }
        let dir = lock_dir(name);
        let resp = self
            .range(with_values(pb::range_by_create(
                dir.as_bytes(),
                SortOrder::Ascend,
            )))
            .await?;
        Ok(super::kinds::candidates(dir.as_bytes(), &resp.kvs))
    }

    pub(super) async fn txn(&self, txn: pb::TxnRequest) -> Result<pb::TxnResponse> {
        self.client.txn(txn).await.map_err(map_err)
    }

    pub(super) async fn range(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse> {
        self.client.range(req).await.map_err(map_err)
    }

    /// Every contender of `dir`, oldest first (for queues whose head the short ranges missed).
    pub(super) async fn all_contenders(&self, dir: &str) -> Result<Vec<Contender>> {
        let resp = self
            .range(pb::range_by_create(dir.as_bytes(), SortOrder::Ascend))
            .await?;
        Ok(direct_children(dir.as_bytes(), &resp.kvs))
    }

    /// The queue as seen by `mine` (a mutex or writer) from one range of the keys before it,
    /// youngest first (`newest` right after its key was put, or `before` its revision; keys
    /// younger than `mine` are skipped), and how many keys are ahead of it (exact when the
    /// range reached the oldest key, else the directory's count less one, an upper bound).
    /// Only a range that shows no older key of the directory itself but has more falls back
    /// to the whole queue. Holding needs no older key, so the oldest key (the holder) need not
    /// be ranged: one sorted range instead of two, each of which etcd serves by reading every
    /// key of the directory.
    pub(super) async fn view_behind(
        &self,
        dir: &str,
        mine: &Contender,
        desc: &pb::RangeResponse,
    ) -> Result<(View, Option<u32>)> {
        let d = dir.as_bytes();
        let older: Vec<Contender> = direct_children(d, &desc.kvs)
            .into_iter()
            .filter(|c| c.rev < mine.rev)
            .collect();
        let ahead = |exact: usize| match desc.more {
            false => u32::try_from(exact).ok(),
            true => u32::try_from(desc.count.saturating_sub(1)).ok(),
        };
        if let Some(pred) = older.first() {
            // The oldest key listed stands for the holder: it is not `mine`, which is all the
            // verdict asks of it.
            let view = View {
                holder: older.last().cloned(),
                pred: Some(pred.clone()),
            };
            return Ok((view, ahead(older.len())));
        }
        if !desc.more {
            let view = View {
                holder: Some(mine.clone()),
                pred: None,
            };
            return Ok((view, Some(0)));
        }
        let all = self.all_contenders(dir).await?;
        let pred = all.iter().take_while(|c| c.rev < mine.rev).last().cloned();
        let at = all.iter().take_while(|c| c.rev < mine.rev).count();
        let view = View {
            holder: all.first().cloned(),
            pred,
        };
        Ok((view, u32::try_from(at).ok()))
    }

    /// The queue as seen by `mine` from an ascending range of the oldest keys, falling back to
    /// the whole queue when it does not reach `mine` (a key that was there before the attempt).
    pub(super) async fn view(
        &self,
        dir: &str,
        mine: &Contender,
        asc: &pb::RangeResponse,
    ) -> Result<View> {
        let listed = direct_children(dir.as_bytes(), &asc.kvs);
        let complete =
            !listed.is_empty() && (listed.iter().any(|c| c.rev >= mine.rev) || !asc.more);
        let all = match complete {
            true => listed,
            false => self.all_contenders(dir).await?,
        };
        let holder = all.first().cloned();
        let pred = all.iter().take_while(|c| c.rev < mine.rev).last().cloned();
        Ok(View { holder, pred })
    }
}
