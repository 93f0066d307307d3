//! The Lua scripts that make each lock operation one atomic step on the server, and [`Lua`],
//! which runs them by SHA1. The scripts are the whole protocol on the server side; `mod.rs`
//! only sends them.

use redis::Script;

/// Leaves the head of the wait queue (KEYS[qi], expiries in KEYS[ei]) in `head`, after dropping
/// waiters whose place expired. Costs one ZRANGE when nobody waits. Shared by the scripts below.
const PURGE_HEAD: &str = r"
local head = redis.call('ZRANGE', KEYS[qi], 0, 0)[1]
local t, now_ms
if head then
  t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while head do
    if tonumber(redis.call('HGET', KEYS[ei], head) or '0') > now_ms then break end
    redis.call('ZREM', KEYS[qi], head)
    redis.call('HDEL', KEYS[ei], head)
    head = redis.call('ZRANGE', KEYS[qi], 0, 0)[1]
  end
end
";

/// KEYS: lock, fence, queue, waiter expiries. ARGV: token, lease ms, waiter ttl ms (0: the
/// caller will not wait, do not queue it), queue member (`<token>:<instance>`). Returns
/// {1, fence} when acquired, {0, pttl} when busy. Only the head of the wait queue (or anyone,
/// when nobody waits) may take a free lock.
///
/// A lock already held with the caller's token is the caller's: an earlier attempt succeeded
/// but its reply was lost. That counts as acquired, with the lease set anew from now (the
/// client counts it from this attempt) and a new fence. `pcall`, because a foreign holder may
/// have left another type at the key (a Redisson hash), which `GET` refuses.
///
/// The fence counter starts at the server's clock in microseconds whenever it is missing
/// (first use, expiry after a day unused, a restart that lost the data) and counts up from
/// there, so it keeps increasing across data loss unless the clock steps back or the key saw
/// more than a million acquisitions a second.
pub(super) const ACQUIRE: &str = r"
local won = (not head or head == ARGV[4]) and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not won and redis.pcall('GET', KEYS[1]) == ARGV[1] then
  won = redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if won then
  if head then
    redis.call('ZREM', KEYS[3], ARGV[4])
    redis.call('HDEL', KEYS[4], ARGV[4])
  end
  local f = redis.call('INCR', KEYS[2])
  if f < 1000000000000 then
    local t = redis.call('TIME')
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', 86400000)
  end
  return {1, f}
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  if not t then
    t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  if not redis.call('ZSCORE', KEYS[3], ARGV[4]) then
    redis.call('ZADD', KEYS[3], tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[4])
  end
  redis.call('HSET', KEYS[4], ARGV[4], now_ms + ttl)
  redis.call('PEXPIRE', KEYS[3], ttl * 2)
  redis.call('PEXPIRE', KEYS[4], ttl * 2)
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// KEYS: lock, queue, waiter expiries. ARGV: token, channel, wake channel prefix. Returns 1
/// when released, 0 when not held by token. With distlock waiters queued, the lock goes to the
/// first of them, so only that waiter is woken: the message `<token>:<instance>` on
/// `<prefix>-wake:<instance>`. Otherwise the lock key is published for Spring's waiters: on
/// `<prefix>-channel` (Spring Integration up to 6.5.2) and on `<prefix>-channel:<lock key>`
/// (later versions).
pub(super) const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if head then
  redis.call('PUBLISH', ARGV[3] .. string.sub(head, 34), head)
else
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  redis.call('PUBLISH', ARGV[2] .. ':' .. KEYS[1], KEYS[1])
end
return 1
";

/// KEYS: lock, queue, waiter expiries. ARGV: channel, wake channel prefix. Returns 1 when a
/// holder was removed. [`RELEASE`] without the owner check: an operator's forced release, which
/// wakes waiters the same way.
pub(super) const FORCE_RELEASE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[1])
if head then
  redis.call('PUBLISH', ARGV[2] .. string.sub(head, 34), head)
else
  redis.call('PUBLISH', ARGV[1], KEYS[1])
  redis.call('PUBLISH', ARGV[1] .. ':' .. KEYS[1], KEYS[1])
end
return 1
";

/// KEYS: queue, waiter expiries, lock. ARGV: queue member, wake channel prefix. Leaves the
/// queue; when that makes another waiter the head of a free lock, wakes it.
pub(super) const LEAVE: &str = r"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
if head and head ~= ARGV[1] then return 1 end
local next = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if next and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('PUBLISH', ARGV[2] .. string.sub(next, 34), next)
end
return 1
";

/// A Lua script with its SHA1, run by EVALSHA (EVAL when the server does not know it yet).
pub(super) struct Lua {
    pub(super) body: String,
    pub(super) sha: String,
}

impl Lua {
    pub(super) fn new(body: &str) -> Self {
        Lua {
            sha: Script::new(body).get_hash().to_owned(),
            body: body.to_owned(),
        }
    }

    pub(super) fn with_queue(body: &str, queue_key: usize, expiry_key: usize) -> Self {
        let purge = PURGE_HEAD
            .replace("KEYS[qi]", &format!("KEYS[{queue_key}]"))
            .replace("KEYS[ei]", &format!("KEYS[{expiry_key}]"));
        Lua::new(&format!("{purge}{body}"))
    }
}

/// KEYS: lock. ARGV: token, lease ms.
pub(super) const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// KEYS: lock, fence. Returns {pttl, fence}.
pub(super) const INSPECT: &str = r"
return {redis.call('PTTL', KEYS[1]), tonumber(redis.call('GET', KEYS[2]) or '-1')}
";

pub(super) struct Scripts {
    pub(super) acquire: Lua,
    pub(super) release: Lua,
    pub(super) force_release: Lua,
    pub(super) extend: Lua,
    pub(super) inspect: Lua,
    pub(super) leave: Lua,
}
