//! The Lua scripts that make each lock operation one atomic step on the server, and [`Lua`],
//! which runs them by SHA1. The scripts are the whole protocol on the server side; `mod.rs`
//! only sends them.

use redis::Script;

/// Queue helpers shared by the scripts that use the wait queue (KEYS[qi], expiries in
/// KEYS[ei]; the lock is always KEYS[1]):
///
/// - `purge()` returns the head of the queue and how long its place still lasts (ms), after
///   dropping waiters whose place expired. One ZRANGE when nobody waits.
/// - `pass_on(channel, legacy, wake, leaving)` gives the lock up: to the head of the queue
///   (skipping the token `leaving`), which gets the lock key set to its token for as long as
///   its place lasts and a message on its instance's wake channel, so that no `SET NX` client
///   can take the lock between a release and the head's confirmation; with nobody queued, the
///   key is deleted and published for Spring's waiters on `<channel>:<lock key>` (Spring
///   Integration after 6.5.2), and also on `<channel>` (up to 6.5.2) when `legacy` is `1`.
const QUEUE: &str = r"
local now_ms
local function clock()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end
local function purge()
  local head = redis.call('ZRANGE', KEYS[qi], 0, 0)[1]
  while head do
    local left = tonumber(redis.call('HGET', KEYS[ei], head) or '0') - clock()
    if left > 0 then return head, left end
    redis.call('ZREM', KEYS[qi], head)
    redis.call('HDEL', KEYS[ei], head)
    head = redis.call('ZRANGE', KEYS[qi], 0, 0)[1]
  end
end
local function hand_to(head, left, wake)
  redis.call('SET', KEYS[1], string.sub(head, 1, 32), 'PX', left)
  redis.call('PUBLISH', wake .. string.sub(head, 34), head)
end
local function pass_on(channel, legacy, wake, leaving)
  local head, left = purge()
  while head and string.sub(head, 1, 32) == leaving do
    redis.call('ZREM', KEYS[qi], head)
    redis.call('HDEL', KEYS[ei], head)
    head, left = purge()
  end
  if head then
    hand_to(head, left, wake)
    return
  end
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', channel .. ':' .. KEYS[1], KEYS[1])
  if legacy == '1' then redis.call('PUBLISH', channel, KEYS[1]) end
end
";

/// KEYS: lock, fence, queue, waiter expiries. ARGV: token, lease ms, waiter ttl ms (0: the
/// caller will not wait, do not queue it), queue member (`<token>:<instance>`). Returns
/// {1, fence} when acquired, {0, pttl} when busy. Only the head of the wait queue (or anyone,
/// when nobody waits) may take a free lock.
///
/// A lock already held with the caller's token is the caller's: the release before it handed
/// the lock to the caller as head of the queue, or an earlier attempt succeeded but its reply
/// was lost. That counts as acquired, with the lease set anew from now (the client counts it
/// from this attempt) and a new fence. `pcall`, because a foreign holder may have left
/// another type at the key (a Redisson hash), which `GET` refuses.
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
  if not redis.call('ZSCORE', KEYS[3], ARGV[4]) then
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[3], tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[4])
  end
  redis.call('HSET', KEYS[4], ARGV[4], clock() + ttl)
  redis.call('PEXPIRE', KEYS[3], ttl * 2)
  redis.call('PEXPIRE', KEYS[4], ttl * 2)
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// The smallest fence counter value that [`ACQUIRE`] accepts as seeded; below it the counter
/// was missing and is restarted from the server's clock.
pub(super) const FENCE_SEED: i64 = 1_000_000_000_000;

/// KEYS: lock, queue, waiter expiries. ARGV: token, channel, wake channel prefix, legacy
/// channel (`1` or `0`). Returns 1 when released, 0 when not held by token. The lock goes to
/// the first distlock waiter, if any (see `pass_on`), else it is deleted and published.
pub(super) const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
pass_on(ARGV[2], ARGV[4], ARGV[3], ARGV[1])
return 1
";

/// KEYS: lock, queue, waiter expiries. ARGV: channel, wake channel prefix, legacy channel.
/// Returns 1 when a holder was removed. [`RELEASE`] without the owner check: an operator's
/// forced release, which passes the lock on the same way.
pub(super) const FORCE_RELEASE: &str = r"
local holder = redis.pcall('GET', KEYS[1])
if not holder then return 0 end
if type(holder) ~= 'string' then holder = '' end
pass_on(ARGV[1], ARGV[3], ARGV[2], holder)
return 1
";

/// KEYS: lock, queue, waiter expiries. ARGV: queue member, wake channel prefix, channel,
/// legacy channel. Leaves the queue. A lock that was already handed to the leaver is passed
/// on; a free lock goes to the new head of the queue.
pub(super) const LEAVE: &str = r"
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
local token = string.sub(ARGV[1], 1, 32)
local holder = redis.pcall('GET', KEYS[1])
if holder == token then
  pass_on(ARGV[3], ARGV[4], ARGV[2], token)
elseif not holder then
  local head, left = purge()
  if head then hand_to(head, left, ARGV[2]) end
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
        let purge = QUEUE
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
