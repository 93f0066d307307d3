//! The Lua scripts that make each lock operation one atomic step on the server, and [`Lua`],
//! which runs them by SHA1. The scripts are the whole protocol on the server side; `mod.rs`
//! only sends them.

use redis::Script;

/// Helpers shared by the scripts that use the wait queue. KEYS are always lock, fence, queue
/// (`KEYS[3]`), waiters (`KEYS[4]`: each waiter's `<expiry ms>:<lease ms>`).
///
/// - `fence()` takes the next fence: `INCR`, and when the counter was missing it starts at the
///   server's clock in microseconds.
/// - `purge()` returns the head of the queue and the lease it asked for, after dropping
///   waiters whose place expired. One ZRANGE when nobody waits.
/// - `hand_to(head, lease, wake)` gives the lock to a waiter: the lock key is set to its token
///   with its lease, it leaves the queue, takes a fence, and learns both from a message
///   `<token>:<instance>:<fence>` on its instance's wake channel. It needs no round trip of its
///   own to take the lock (see `Backend::take_grant`); if the message is lost, its next attempt
///   finds the lock carrying its token.
/// - `pass_on(channel, legacy, wake, leaving)` gives the lock up: to the head of the queue
///   (skipping the token `leaving`), so that no `SET NX` client can take it between a release
///   and the next holder; with nobody queued, the key is deleted and published for Spring's
///   waiters on `<channel>:<lock key>` (Spring Integration after 6.5.2), and also on `<channel>`
///   (up to 6.5.2) when `legacy` is `1`.
const QUEUE: &str = r"
local now_ms
local function clock()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end
local function fence()
  local f = redis.call('INCR', KEYS[2])
  if f < 1000000000000 then
    local t = redis.call('TIME')
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', 86400000)
  end
  return f
end
local function purge()
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  while head do
    local place = redis.call('HGET', KEYS[4], head) or '0:0'
    local expiry, lease = string.match(place, '^(%d+):(%d+)$')
    if tonumber(expiry or '0') > clock() then return head, lease end
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head)
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  end
end
local function hand_to(head, lease, wake)
  redis.call('SET', KEYS[1], string.sub(head, 1, 32), 'PX', lease)
  redis.call('ZREM', KEYS[3], head)
  redis.call('HDEL', KEYS[4], head)
  redis.call('PUBLISH', wake .. string.sub(head, 34), head .. ':' .. string.format('%.0f', fence()))
end
local function pass_on(channel, legacy, wake, leaving)
  local head, lease = purge()
  while head and string.sub(head, 1, 32) == leaving do
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head)
    head, lease = purge()
  end
  if head then
    hand_to(head, lease, wake)
    return
  end
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', channel .. ':' .. KEYS[1], KEYS[1])
  if legacy == '1' then redis.call('PUBLISH', channel, KEYS[1]) end
end
";

/// KEYS: lock, fence, queue, waiter places. ARGV: token, lease ms, waiter ttl ms (0: the
/// caller will not wait, do not queue it), queue member (`<token>:<instance>`). Returns
/// {1, fence} when acquired, {0, pttl} when busy. Only the head of the wait queue (or anyone,
/// when nobody waits) may take a free lock.
///
/// A lock already held with the caller's token is the caller's: a release handed it over and
/// the message was lost, or an earlier attempt succeeded but its reply was lost. That counts
/// as acquired, with the lease set anew from now (the client counts it from this attempt) and
/// a new fence. `pcall`, because a foreign holder may have left another type at the key (a
/// Redisson hash), which `GET` refuses.
///
/// The fence counter starts at the server's clock in microseconds whenever it is missing
/// (first use, expiry after a day unused, a restart that lost the data) and counts up from
/// there, so it keeps increasing across data loss unless the clock steps back or the key saw
/// more than a million acquisitions a second. [`FENCE_SEED`] is the bound both paths use.
pub(super) const ACQUIRE: &str = r"
local head = purge()
local won = (not head or head == ARGV[4]) and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not won and redis.pcall('GET', KEYS[1]) == ARGV[1] then
  won = redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if won then
  if head then
    redis.call('ZREM', KEYS[3], ARGV[4])
    redis.call('HDEL', KEYS[4], ARGV[4])
  end
  return {1, fence()}
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  if not redis.call('ZSCORE', KEYS[3], ARGV[4]) then
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[3], tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[4])
  end
  redis.call('HSET', KEYS[4], ARGV[4], string.format('%.0f', clock() + ttl) .. ':' .. ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ttl * 2)
  redis.call('PEXPIRE', KEYS[4], ttl * 2)
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// The smallest fence counter value that [`ACQUIRE`] accepts as seeded; below it the counter
/// was missing and is restarted from the server's clock.
pub(super) const FENCE_SEED: i64 = 1_000_000_000_000;

/// KEYS: lock, fence, queue, waiter places. ARGV: token, channel, wake channel prefix, legacy
/// channel (`1` or `0`). Returns 1 when released, 0 when not held by token. The lock goes to
/// the first distlock waiter, if any (see `pass_on`), else it is deleted and published.
pub(super) const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
pass_on(ARGV[2], ARGV[4], ARGV[3], ARGV[1])
return 1
";

/// KEYS: lock, fence, queue, waiter places. ARGV: channel, wake channel prefix, legacy
/// channel. Returns 1 when a holder was removed. [`RELEASE`] without the owner check: an
/// operator's forced release, which passes the lock on the same way.
pub(super) const FORCE_RELEASE: &str = r"
local holder = redis.pcall('GET', KEYS[1])
if not holder then return 0 end
if type(holder) ~= 'string' then holder = '' end
pass_on(ARGV[1], ARGV[3], ARGV[2], holder)
return 1
";

/// KEYS: lock, fence, queue, waiter places. ARGV: queue member, wake channel prefix, channel,
/// legacy channel. Leaves the queue. A lock already handed to the leaver (it gave up just
/// after a release chose it) is passed on; a free lock goes to the new head of the queue.
pub(super) const LEAVE: &str = r"
local removed = redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local token = string.sub(ARGV[1], 1, 32)
local holder = redis.pcall('GET', KEYS[1])
if holder == token then
  pass_on(ARGV[3], ARGV[4], ARGV[2], token)
  return 1
end
if removed == 0 then return 0 end
if not holder then
  local head, lease = purge()
  if head then hand_to(head, lease, ARGV[2]) end
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

    /// A script that uses the queue helpers (KEYS lock, fence, queue, waiter places).
    pub(super) fn with_queue(body: &str) -> Self {
        Lua::new(&format!("{QUEUE}{body}"))
    }
}

/// KEYS: lock. ARGV: token, lease ms.
pub(super) const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// KEYS: locks. ARGV: token and lease ms of each lock, in turn. Returns 1 for each lock
/// extended, 0 for each not held by its token: a batch of renewals in one call.
pub(super) const EXTEND_MANY: &str = r"
local out = {}
for i = 1, #KEYS do
  out[i] = 0
  if redis.pcall('GET', KEYS[i]) == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  end
end
return out
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
    pub(super) extend_many: Lua,
    pub(super) inspect: Lua,
    pub(super) leave: Lua,
}
