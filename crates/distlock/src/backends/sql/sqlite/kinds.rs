//! Read holds and semaphore permits on SQLite (see `sql::kinds` for the layout): each
//! operation is one IMMEDIATE transaction, so every statement of it sees the file as the
//! others left it; the database's clock is read once (`row`) and handed to the others.

use rusqlite::{params, OptionalExtension, Transaction};

use crate::backends::sql::dialect::Lite;
use crate::backends::sql::kinds::{Share, PERMIT, WRITER};

/// What a shared attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShareOutcome {
    Acquired(i64),
    /// Busy, with the remaining lease of what keeps it out (when known).
    Busy(Option<i64>),
    /// The semaphore's holders use this many permits.
    Disagree(i64),
}

/// The key's row: (owner, fence, expires ms, now ms).
type Row = (Option<String>, i64, i64, i64);
/// A live hold: (token, kind, permits, expires ms).
type Hold = (String, String, i64, i64);

fn row(tx: &Transaction<'_>, sql: &Lite, region: &str, key: &str) -> rusqlite::Result<Option<Row>> {
    tx.prepare_cached(&sql.row)?
        .query_row(params![region, key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()
}

fn live_holds(
    tx: &Transaction<'_>,
    sql: &Lite,
    region: &str,
    key: &str,
    now: i64,
) -> rusqlite::Result<Vec<Hold>> {
    let mut stmt = tx.prepare_cached(&sql.live_holds)?;
    let rows = stmt.query_map(params![region, key, now], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
    })?;
    rows.collect()
}

/// Takes a share of `key` for `token`: when the row is free, expired or already marked for
/// this kind, nothing keeps it out (a waiting writer keeps readers out; a full semaphore keeps
/// permits out), or the token holds it already (a repeated attempt).
pub(super) fn acquire(
    tx: &Transaction<'_>,
    sql: &Lite,
    (region, key): (&str, &str),
    (token, described): (&str, &str),
    share: Share,
    lease_ms: i64,
) -> rusqlite::Result<ShareOutcome> {
    let mut found = row(tx, sql, region, key)?;
    if found.is_none() {
        // The key's first use.
        tx.prepare_cached(&sql.touch_row)?
            .execute(params![region, key])?;
        found = row(tx, sql, region, key)?;
    }
    let Some((owner, fence, expires, now)) = found else {
        return Ok(ShareOutcome::Busy(None));
    };
    let holds = live_holds(tx, sql, region, key, now)?;
    let others = || holds.iter().filter(|h| h.0 != token && h.1 == share.code);
    let mine = holds.iter().any(|h| h.0 == token && h.1 == share.code);
    if !mine {
        if share.code == PERMIT {
            if let Some(h) = others().find(|h| h.2 != i64::from(share.permits)) {
                return Ok(ShareOutcome::Disagree(h.2));
            }
        }
        let compatible = owner.is_none() || expires <= now || owner.as_deref() == Some(share.mark);
        let writer_waits = share.is_read() && holds.iter().any(|h| h.1 == WRITER);
        let room = share.permits == 0 || others().count() < share.permits as usize;
        if !compatible || writer_waits || !room {
            let until = if compatible {
                others().map(|h| h.3).min().unwrap_or(expires)
            } else {
                expires
            };
            return Ok(ShareOutcome::Busy(Some(until - now)));
        }
    }
    let next = fence + 1;
    let until = others().map(|h| h.3).max().unwrap_or(0).max(now + lease_ms);
    tx.prepare_cached(&sql.put_hold)?.execute(params![
        region,
        key,
        token,
        share.code,
        share.permits,
        now + lease_ms,
        next,
        described
    ])?;
    tx.prepare_cached(&sql.mark_row)?
        .execute(params![region, key, share.mark, next, now, until])?;
    Ok(ShareOutcome::Acquired(next))
}

/// Gives a share back (and removes whatever expired): the row keeps the longest lease of the
/// shares left, or is free.
pub(super) fn release(
    tx: &Transaction<'_>,
    sql: &Lite,
    (region, key): (&str, &str),
    token: &str,
) -> rusqlite::Result<bool> {
    let mut stmt = tx.prepare_cached(&sql.drop_hold)?;
    let gone = stmt
        .query_map(params![region, key, token], |r| r.get::<_, bool>(0))?
        .collect::<rusqlite::Result<Vec<bool>>>()?
        .contains(&true);
    // Released when the share was live and the row still marked shared.
    Ok(gone
        && tx
            .prepare_cached(&sql.settle_row)?
            .execute(params![region, key])?
            > 0)
}

/// Renews a live share; the row's lease grows with it (never shrinks: other shares may need
/// it).
pub(super) fn extend(
    tx: &Transaction<'_>,
    sql: &Lite,
    (region, key): (&str, &str),
    token: &str,
    lease_ms: i64,
) -> rusqlite::Result<bool> {
    let Some((_, _, _, now)) = row(tx, sql, region, key)? else {
        return Ok(false);
    };
    let extended = tx
        .prepare_cached(&sql.extend_hold)?
        .execute(params![region, key, token, lease_ms, now])?
        > 0;
    if extended {
        tx.prepare_cached(&sql.raise_row)?
            .execute(params![region, key, now + lease_ms])?;
    }
    Ok(extended)
}

/// Removes every holder of the key, of any kind; true if one was live.
pub(super) fn force(
    tx: &Transaction<'_>,
    sql: &Lite,
    (region, key): (&str, &str),
) -> rusqlite::Result<bool> {
    let Some((owner, _, expires, now)) = row(tx, sql, region, key)? else {
        return Ok(false);
    };
    let shares = live_holds(tx, sql, region, key, now)?
        .iter()
        .any(|h| h.1 != WRITER);
    tx.prepare_cached(&sql.drop_shares)?
        .execute(params![region, key, now])?;
    let freed = tx
        .prepare_cached(&sql.force_delete)?
        .execute(params![region, key])?
        > 0;
    Ok(freed || shares || (owner.is_some() && expires > now))
}
