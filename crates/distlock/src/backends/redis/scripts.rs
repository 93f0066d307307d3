//! The Lua scripts that make each lock operation one atomic step on the server, and [`Lua`],
//! which runs them by SHA1. The scripts are the whole protocol on the server side; `mod.rs`
//! only sends them.

use redis::Script;

use super::kind_scripts::{
    KINDS, KIND_ACQUIRE, KIND_ACQUIRE_FAST, KIND_EXTEND, KIND_RELEASE, KIND_RELEASE_FAST,
};

macro_rules! queue_clock {
    () => {
        r"
local now_ms, now_us
local function clock()
  if not now_ms then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
  return now_ms
end
local function clock_us()
  clock()
  return now_us
end
"
    };
}

/// `fence()` of the single-node scripts: the counter, seeded from the clock when missing.
macro_rules! counter_fence {
    () => {
        r"local function fence()
  local f = redis.call('INCR', KEYS[2])
  if f < 1000000000000 then
    local t = redis.call('TIME')
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', 86400000)
  end
  return f
end
local function fence_now()
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
"
    };
}

/// `fence()` where a failover can roll the counter back (Redis Cluster): the counter, but never
/// below the server's clock in microseconds, so a fence issued after a failover exceeds every
/// fence the lost writes issued before it, as long as the promoted node's clock is not behind
/// the old master's by more than the failover took.
macro_rules! floored_fence {
    () => {
        r"local function fence()
  local f = redis.call('INCR', KEYS[2])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if f < now then
    f = now
    redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', 86400000)
  end
  return f
end
local function fence_now()
  local t = redis.call('TIME')
  return math.max(tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(t[1]) * 1000000 + tonumber(t[2]))
end
"
    };
}

macro_rules! queue_helpers {
    () => {
        r"local OWNERS = KEYS[#KEYS]
if not string.find(OWNERS, '}:owners', 1, true) then
  return redis.error_reply('distlock: the owners key must be the last key')
end
local function own(token, desc, px, alone)
  if alone then redis.call('DEL', OWNERS) end
  if desc and desc ~= '' then
    redis.call('HSET', OWNERS, token, desc)
    if redis.call('PTTL', OWNERS) < tonumber(px) then redis.call('PEXPIRE', OWNERS, px) end
  end
end
local function purge()
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  while head do
    local place = redis.call('HGET', KEYS[4], head) or '0:0'
    local expiry, lease, kind = string.match(place, '^(%d+):(%d+):?(%a*)$')
    if tonumber(expiry or '0') > clock() then return head, lease, kind, tonumber(expiry) end
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head, head .. '|o')
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  end
end
local function hand_to(head, lease, wake, kind, expiry)
  local token = string.sub(head, 1, 32)
  local px = math.max(math.min(tonumber(lease), expiry - clock()), 1)
  local desc = redis.call('HGET', KEYS[4], head .. '|o')
  if kind == 'w' then
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 'mode', 'write', token .. ':write', '1')
    redis.call('PEXPIRE', KEYS[1], px)
  else
    redis.call('SET', KEYS[1], token, 'PX', px)
  end
  own(token, desc, px, true)
  redis.call('ZREM', KEYS[3], head)
  redis.call('HDEL', KEYS[4], head, head .. '|o')
  local told = head
  if px == tonumber(lease) then told = head .. ':' .. string.format('%.0f', fence()) end
  redis.call('PUBLISH', wake .. string.sub(head, 34), told)
end
local function pass_on(channel, legacy, wake, leaving, grants)
  local head, lease, kind, expiry = purge()
  while head and string.sub(head, 1, 32) == leaving do
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head, head .. '|o')
    head, lease, kind, expiry = purge()
  end
  if head and grants ~= false and (kind == '' or kind == 'w') then
    hand_to(head, lease, wake, kind, expiry)
    return true
  end
  redis.call('DEL', KEYS[1], OWNERS)
  redis.call('PUBLISH', channel .. ':' .. KEYS[1], KEYS[1])
  if legacy == '1' then redis.call('PUBLISH', channel, KEYS[1]) end
  return false
end
"
    };
}

/// Helpers shared by the scripts that use the wait queue. KEYS are always lock, fence, queue
/// (`KEYS[3]`), waiters (`KEYS[4]`: each waiter's `<expiry ms>:<lease ms>`, followed by
/// `:r`, `:w` or `:s` for a reader, writer or permit taker; nothing for a mutex waiter; and
/// beside it, field `<member>|o`, the waiter's owner description, so that a hand-over can
/// record it: a field of its own, so that the place keeps the layout older versions parse),
/// and the owners hash is always the last key (`OWNERS`).
///
/// - `own(token, desc, px, alone)` records a holder's description in the owners hash
///   (`<token>` = description), whose expiry it raises to `px` if shorter; `alone` (a mutex or
///   writer, or the first reader or permit) drops every other description first, which keeps
///   the hash bounded by the live holders. A missing or empty `desc` records nothing: the
///   holder shows as unknown.
///
/// - `fence()` takes the next fence: `INCR`, and when the counter was missing it starts at the
///   server's clock in microseconds (on Redis Cluster: never below the server's clock, see
///   `floored_fence!`). Every kind of the key takes its fences from it. `fence_now()` is the
///   counter without taking one (floored likewise): every fence issued so far is at most it,
///   every later one exceeds it. A busy attempt reports it, so that a late hand-over message
///   can be told from a hand-over after the attempt (see `Grants` in `notify.rs`).
/// - `purge()` returns the head of the queue, the lease it asked for, its kind (`''`, `'r'`,
///   `'w'`, `'s'`) and when its place expires (server ms), after dropping waiters whose place
///   expired. One ZRANGE when nobody waits.
/// - `hand_to(head, lease, wake, kind, expiry)` gives the lock to a mutex waiter (the lock key
///   is set to its token) or a writer (the lock key becomes a Redisson write hash with its
///   field), and takes it out of the queue. The grant lives only as long as the head's place
///   would have (`expiry`, at most the waiter ttl), or its lease if shorter: a head that died
///   while queued holds the key no longer than its place would have held up the queue. When
///   the grant is the whole lease, it takes a fence and tells the head with
///   `<token>:<instance>:<fence>` on its instance's wake channel, and the head holds the lock
///   without a round trip of its own (see `RedisBackend::take_grant`). Otherwise the message is
///   `<token>:<instance>` (a wake-up, no grant) and the head claims the lock with its next
///   attempt, which finds its own token and sets its lease and a fence; so does a head whose
///   message was lost. A grant never claimed lapses and the key is free; the waiters behind
///   learn it from their next poll (at most `RegistryOptions::max_poll` later).
/// - Whoever leaves the queue loses its `<member>|o` field with its place; `hand_to` records
///   it for the head it grants the lock to, `pass_on` deletes the owners hash with the key.
/// - `pass_on(channel, legacy, wake, leaving, grants)` gives the lock up: to the head of the
///   queue (skipping the token `leaving`) when that is a mutex waiter or a writer and `grants`
///   is not `false` (Redlock passes `false`: a hand-over on one node is no majority), so that no
///   `SET NX` client can take it between a release and the next holder; otherwise the key is
///   deleted and published for Spring's waiters and every distlock waiter on
///   `<channel>:<lock key>` (Spring Integration after 6.5.2), and also on `<channel>` (up to
///   6.5.2) when `legacy` is `1`. Readers and permit takers at the head are woken that way
///   and take the key with their next attempt. Returns whether it handed the lock over.
const QUEUE: &str = concat!(queue_clock!(), counter_fence!(), queue_helpers!());

/// [`QUEUE`] with the fence floored at the server clock (see `floored_fence!`).
const QUEUE_FLOORED: &str = concat!(queue_clock!(), floored_fence!(), queue_helpers!());

/// KEYS: lock, fence, and except on Redis Cluster owners. ARGV: token, and with owners the
/// owner description and lease ms. The uncontended acquisition's fence, sent in one pipeline
/// after its `SET NX PX`: the next fence (`fence()`, seeded or floored as the queue scripts'
/// is) when the lock carries `token`, else 0 without touching the counter, so that a failed
/// attempt never moves the counter past the holder's fence (which `INSPECT` reports). The
/// holder's description goes to the owners hash here, in the same round trip: the `SET`
/// stays the plain one every foreign client uses. On Redis Cluster [`OWN`] writes it instead,
/// in the same pipeline (see there).
pub(super) const FENCE_HELD: &str = r"
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if KEYS[3] then
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return fence()
";

/// KEYS: lock, fence, queue, waiter places, owners. ARGV: token, lease ms, waiter ttl ms (0:
/// the caller will not wait, do not queue it), queue member (`<token>:<instance>`), owner
/// description, and on Redlock `0` (the queue only tells readers that an exclusive waiter waits; no head rule, which would
/// let each node pick another head). Returns {1, fence} when acquired, {0, pttl, fence_now}
/// when busy, and with a place in the queue {0, pttl, fence_now, rank} (0 for the head).
/// Only the head of the wait queue (or anyone, when nobody waits) may take a free lock; a
/// held lock is busy without a look at the queue.
///
/// A lock reserved for the caller's backend instance (`~<instance>:<grace>`, see [`RELEASE`])
/// is taken as a free one is, without a look at the queue. Another instance's reservation is
/// busy while its slice lasts (the reply's `PTTL` is what is left of the slice), and free for
/// the head of the queue once the slice has ended.
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
local head, won, retry = nil, false, nil
local holder = redis.pcall('GET', KEYS[1])
if holder == ARGV[1] then
  won = redis.call('PEXPIRE', KEYS[1], ARGV[2])
  head = ARGV[4]
elseif not holder then
  head = ARGV[6] ~= '0' and purge() or nil
  won = (not head or head == ARGV[4]) and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
elseif type(holder) == 'string' and string.byte(holder) == 126 then
  local by, grace = string.match(holder, '^~(%x+):(%d+)$')
  if by == string.sub(ARGV[4], 34) then
    won = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    head = ARGV[4]
  elseif by then
    local left = redis.call('PTTL', KEYS[1]) - tonumber(grace)
    if left > 0 then
      retry = left
    else
      head = ARGV[6] ~= '0' and purge() or nil
      won = (not head or head == ARGV[4]) and redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    end
  end
end
if won then
  if head or ARGV[6] == '0' then
    redis.call('ZREM', KEYS[3], ARGV[4])
    redis.call('HDEL', KEYS[4], ARGV[4], ARGV[4] .. '|o')
  end
  own(ARGV[1], ARGV[5], ARGV[2], true)
  return {1, fence()}
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('ZADD', KEYS[3], 'NX', clock_us(), ARGV[4])
  redis.call('HSET', KEYS[4], ARGV[4], string.format('%.0f', clock() + ttl) .. ':' .. ARGV[2],
    ARGV[4] .. '|o', ARGV[5])
  redis.call('PEXPIRE', KEYS[3], ttl * 2)
  redis.call('PEXPIRE', KEYS[4], ttl * 2)
  return {0, retry or redis.call('PTTL', KEYS[1]), fence_now(), redis.call('ZRANK', KEYS[3], ARGV[4]) or -1}
end
return {0, retry or redis.call('PTTL', KEYS[1]), fence_now()}
";

/// The smallest fence counter value that [`ACQUIRE`] accepts as seeded; below it the counter
/// was missing and is restarted from the server's clock.
pub(super) const FENCE_SEED: i64 = 1_000_000_000_000;

/// KEYS: lock, fence, queue, waiter places, owners. ARGV: token, channel, wake channel prefix, legacy
/// channel (`1` or `0`), and for a reservation its `PX` (the rest of the slice plus the
/// grace), its value `~<instance>:<grace ms>` and whether to tell the head waiter (`1` or
/// `0`). Returns 4 when reserved, 3 when released
/// and handed to a waiter, 1 when released with nobody to hand it to, 0 when not held by
/// token. The lock goes to the first distlock waiter, if any (see `pass_on`), else it is
/// deleted and published.
///
/// A reservation (the rest of the releasing instance's slice, see
/// [`RedisOptions::hold_slice`](super::RedisOptions::hold_slice)) is made only while
/// somebody is queued: the lock key becomes `~<instance>:<grace>` with `PX` = the rest of the
/// slice plus the grace, which [`ACQUIRE`] from that instance takes at once, so a program
/// that takes the key in a loop keeps it without a hand-over (two process switches and a
/// dozen calls from Lua) each time. The first reservation of a slice, made only when the head
/// of the queue is a mutex waiter, tells it so (`<member>:~` on its wake channel, no fence:
/// not a grant); its next attempt learns what is left of the slice and comes back then, in
/// case the instance does not, and takes the lock. Until the grace (the waiter ttl) has also
/// passed, the key stays taken for everybody else: a key with distlock waiters queued is
/// never free for a plain `SET NX`, also not while the head waiter wakes up, and when every
/// waiter is gone it is free again after as long as a crashed waiter holds up the queue.
/// `pcall`: a hash at the key (a read-write lock or semaphore took it after this hold was
/// lost) is simply not ours.
///
/// The script starts with [`RELEASE_FAST`], before the queue helpers are defined. The client
/// sends it only for a key it saw waited for (else [`RELEASE_ALONE`]), so it looks at the
/// queue once, in `pass_on`: each call into the server from Lua costs about as much as a
/// small command (1 to 2 µs), and a contended lock cycle is mostly such calls.
pub(super) const RELEASE: &str = r"
if ARGV[5] and redis.call('EXISTS', KEYS[3]) == 1 then
  local head, lease, kind
  if ARGV[7] == '1' then head, lease, kind = purge() end
  if ARGV[7] ~= '1' or (head and kind == '') then
    redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[5])
    redis.call('DEL', OWNERS)
    if head then redis.call('PUBLISH', ARGV[3] .. string.sub(head, 34), head .. ':~') end
    return 4
  end
end
if pass_on(ARGV[2], ARGV[4], ARGV[3], ARGV[1]) then return 3 end
return 1
";

/// KEYS: lock, queue, owners. ARGV: token, reservation (`~<instance>:<grace ms>`), its `PX`. The
/// release of a hold within its slice once the head waiter was told (see [`RELEASE`]): returns
/// 0 when not held by token, 4 when reserved, and 2, having done nothing, when nobody is
/// queued any more ([`RELEASE`] then frees the key). Three calls and no helpers to define.
pub(super) const RESERVE: &str = r"
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then return 2 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[3])
return 4
";

/// KEYS: lock, fence, queue, waiter places, owners. ARGV: reservation (`~<instance>:<grace
/// ms>`), token, lease ms, queue member, owner description. Takes the lock reserved for the caller's instance (see
/// [`RELEASE`]): returns {1, fence}, or {0} when the key holds anything else ([`ACQUIRE`] then
/// makes the attempt). The caller leaves the queue, where an earlier busy attempt of its put
/// it: a stale place would later be handed the lock of a hold that has ended.
pub(super) const TAKE: &str = r"
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return {0} end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[4])
redis.call('HDEL', KEYS[4], ARGV[4], ARGV[4] .. '|o')
redis.call('DEL', KEYS[5])
redis.call('HSET', KEYS[5], ARGV[2], ARGV[5])
redis.call('PEXPIRE', KEYS[5], ARGV[3])
return {1, fence()}
";

/// KEYS: lock, queue, owners. ARGV: token, the release channel with the key (`<channel>:<lock key>`),
/// and with `spring_legacy_channel` the legacy channel. The release of a lock that nobody
/// was seen waiting for, on its own: returns 0 when not held by token, 1 when released
/// (deleted and published, as [`RELEASE`] does with nobody queued), and 2, having done
/// nothing, when distlock waiters are queued after all ([`RELEASE`] then hands the lock
/// over). Two keys and two arguments instead of [`RELEASE`]'s eight: the server reads and
/// passes to Lua six arguments fewer and the script joins no strings, which took the server's
/// instructions per uncontended lock cycle from 55,500 to 49,100 (`callgrind`, Redis 7.0).
pub(super) const RELEASE_ALONE: &str = r"
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 2 end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('PUBLISH', ARGV[2], KEYS[1])
if ARGV[3] then redis.call('PUBLISH', ARGV[3], KEYS[1]) end
return 1
";

/// The start of [`RELEASE`]: a lock that is not ours ends it before the helpers are defined.
const RELEASE_FAST: &str = r"
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
";

/// KEYS: lock, fence, queue, waiter places, reader timeout prefix, owners. ARGV: channel, wake
/// channel prefix, legacy channel, Redisson channel, grants (`0` on Redlock). Returns 1 when a live
/// holder was removed. An operator's forced release of whatever holds the key: a mutex (also a
/// foreign client's), every reader (their timeout keys too) or writer, every permit; passed on
/// as a release is. Redisson's waiters hear `0` (readers removed) or `1` (a writer removed).
pub(super) const FORCE_RELEASE: &str = r"
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return 0 end
local removed, leaving = 1, ''
if t == 'string' then
  leaving = redis.call('GET', KEYS[1])
elseif t == 'hash' then
  local mode = redis.call('HGET', KEYS[1], 'mode')
  if mode == 'read' then
    removed = 0
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local n = tonumber(all[i + 1])
      if all[i] ~= 'mode' and n and not writer_field(all[i]) then
        for k = 1, n do removed = math.max(removed, redis.call('DEL', ttl_key(all[i], k))) end
      end
    end
    redis.call('PUBLISH', ARGV[4], '0')
  elseif mode == 'semaphore' then
    removed = math.min(prune_permits(), 1)
  elseif mode == 'write' then
    redis.call('PUBLISH', ARGV[4], '1')
  end
end
pass_on(ARGV[1], ARGV[3], ARGV[2], leaving, ARGV[5] ~= '0')
return removed
";

/// KEYS: lock, fence, queue, waiter places, owners. ARGV: queue member, wake channel prefix,
/// channel, legacy channel, grants (`0` on Redlock). Leaves the queue. A lock already handed to the
/// leaver (it gave up just after a release chose it: the mutex string or a write hash with its
/// token) is passed on; a free lock goes to the new head of the queue, or its waiters are woken;
/// a key held by readers or permits is published, so that readers this waiter kept out (or
/// permit takers behind it) try again.
pub(super) const LEAVE: &str = r"
local grants = ARGV[5] ~= '0'
local removed = redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1], ARGV[1] .. '|o')
local token = string.sub(ARGV[1], 1, 32)
local t = redis.call('TYPE', KEYS[1])['ok']
local handed = false
if t == 'string' then
  handed = redis.call('GET', KEYS[1]) == token
elseif t == 'hash' then
  handed = redis.call('HGET', KEYS[1], 'mode') == 'write'
    and redis.call('HEXISTS', KEYS[1], token .. ':write') == 1
end
if handed then
  pass_on(ARGV[3], ARGV[4], ARGV[2], token, grants)
  return 1
end
if removed == 0 then return 0 end
if t == 'none' then
  local head, lease, kind, expiry = purge()
  if head and grants and (kind == '' or kind == 'w') then
    hand_to(head, lease, ARGV[2], kind, expiry)
  elseif head then
    redis.call('PUBLISH', ARGV[3] .. ':' .. KEYS[1], KEYS[1])
  end
elseif t == 'hash' then
  redis.call('PUBLISH', ARGV[3] .. ':' .. KEYS[1], KEYS[1])
end
return 1
";

/// KEYS: lock, fence, queue, waiter places, reader timeout prefix, owners. Returns {lease left
/// ms (-2: free, -1: no expiry), fence (-1: none yet), kind (`mutex`, `read`, `write`,
/// `semaphore`), holders, live waiters, permits, owners}, changing nothing. Readers and permits
/// whose lease ran out do not count; a key held by nothing else is free. The lease left of
/// readers and permits is the longest of theirs. A string or foreign hash counts as a mutex.
/// `owners` has one description per holder, looked up by its token (the mutex string's value,
/// a reader's or permit's field, a writer's field without `:write`) in the owners hash: `''`
/// where it has none (a foreign holder, or one taken before descriptions were recorded). One
/// `HGET` per holder: bounded by the holders.
pub(super) const INSPECT: &str = r"
local fence = tonumber(redis.call('GET', KEYS[2]) or '-1')
local waiters = 0
for _, e in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local expiry = string.match(redis.call('HGET', KEYS[4], e) or '0:0', '^(%d+):')
  if tonumber(expiry or '0') > clock() then waiters = waiters + 1 end
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return {-2, fence, '', 0, waiters, 0, {}} end
local pttl = redis.call('PTTL', KEYS[1])
local function owner_of(token)
  return redis.call('HGET', OWNERS, token) or ''
end
if t == 'string' then return {pttl, fence, 'mutex', 1, waiters, 0, {owner_of(redis.call('GET', KEYS[1]))}} end
if t ~= 'hash' then return {pttl, fence, 'mutex', 1, waiters, 0, {''}} end
local mode = redis.call('HGET', KEYS[1], 'mode')
local all = redis.call('HGETALL', KEYS[1])
local owners = {}
if mode == 'read' then
  local dead = {}
  local readers, others, longest = scan_readers(
    all,
    -2,
    function(left, longest) return left > longest or left == -1 end,
    function(f) dead[f] = true end
  )
  if readers + others == 0 then return {-2, fence, '', 0, waiters, 0, {}} end
  if others > 0 then longest = pttl end
  for i = 1, #all, 2 do
    if all[i] ~= 'mode' and not dead[all[i]] then owners[#owners + 1] = owner_of(all[i]) end
  end
  return {longest, fence, 'read', readers + others, waiters, 0, owners}
elseif mode == 'semaphore' then
  local live, longest = 0, 0
  for i = 1, #all, 2 do
    if all[i] ~= 'mode' and all[i] ~= 'permits' then
      local left = tonumber(string.match(all[i + 1], '^(%d+)') or '0') - clock()
      if left > 0 then
        live = live + 1
        owners[live] = owner_of(all[i])
        if left > longest then longest = left end
      end
    end
  end
  if live == 0 then return {-2, fence, '', 0, waiters, 0, {}} end
  local permits = tonumber(redis.call('HGET', KEYS[1], 'permits') or '0')
  return {longest, fence, 'semaphore', live, waiters, permits, owners}
elseif mode == 'write' then
  owners[1] = ''
  for i = 1, #all, 2 do
    if writer_field(all[i]) then owners[1] = owner_of(string.sub(all[i], 1, -7)) break end
  end
  return {pttl, fence, 'write', 1, waiters, 0, owners}
end
return {pttl, fence, 'mutex', 1, waiters, 0, {''}}
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

    /// A script that uses the queue helpers (KEYS lock, fence, queue, waiter places); with
    /// `floored`, their fences are floored at the server clock.
    pub(super) fn with_queue(body: &str, floored: bool) -> Self {
        Self::with_queue_after("", body, floored)
    }

    /// As [`with_queue`](Self::with_queue), with `first` run before the helpers are defined.
    fn with_queue_after(first: &str, body: &str, floored: bool) -> Self {
        let queue = if floored { QUEUE_FLOORED } else { QUEUE };
        Lua::new(&format!("{first}{queue}{body}"))
    }

    /// A script that uses the queue helpers and those of the read-write lock and the
    /// semaphore (KEYS lock, fence, queue, waiter places, reader timeout prefix); with
    /// `floored`, their fences are floored at the server clock.
    pub(super) fn with_kinds(body: &str, floored: bool) -> Self {
        let queue = if floored { QUEUE_FLOORED } else { QUEUE };
        Lua::new(&format!("{queue}{KINDS}{body}"))
    }

    /// As [`with_kinds`](Self::with_kinds), with `first` run once `clock()` and `fence()` are
    /// defined and before the other helpers are (see [`KIND_ACQUIRE_FAST`]).
    fn with_kinds_after(first: &str, body: &str, floored: bool) -> Self {
        let fence = if floored {
            floored_fence!()
        } else {
            counter_fence!()
        };
        Lua::new(&format!(
            "{}{fence}{first}{}{KINDS}{body}",
            queue_clock!(),
            queue_helpers!()
        ))
    }
}

/// KEYS: lock, and except on Redis Cluster owners. ARGV: token, lease ms. `pcall`: a hash at
/// the key is not this mutex's. The owners hash (the holder's description alone) keeps the
/// lock's expiry; on Redis Cluster [`OWN_EXTEND`] extends it instead, in the same pipeline.
pub(super) const EXTEND: &str = r"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  if KEYS[2] then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// KEYS: owners. ARGV: token, owner description, lease ms. Records a mutex holder's
/// description, alone, on Redis Cluster, where it follows [`FENCE_HELD`] in its pipeline once
/// the `SET NX` won. A script of its own (one key) because a script whose keys are not all on
/// the node is refused while its slot migrates (`TRYAGAIN`), and the owners hash of a free
/// key does not exist: the lock key, the fence and this each follow their own `ASK`, so the
/// uncontended acquisition keeps working throughout a migration.
pub(super) const OWN: &str = r"
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

/// KEYS: owners. ARGV: token, lease ms. Keeps a mutex holder's description as long as its
/// lease, on Redis Cluster, in [`EXTEND`]'s pipeline (one key each, see [`OWN`]); only the
/// token's own description (a hash left by an earlier holder is not extended).
pub(super) const OWN_EXTEND: &str = r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";

/// KEYS: lock and owners of each lock, in turn. ARGV: token and lease ms of each lock, in
/// turn. Returns 1 for each lock extended, 0 for each not held by its token: a batch of
/// renewals in one call. Each owners hash keeps its lock's expiry, as in [`EXTEND`].
pub(super) const EXTEND_MANY: &str = r"
local out = {}
for i = 1, #KEYS / 2 do
  out[i] = 0
  if redis.pcall('GET', KEYS[2 * i - 1]) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[2 * i], ARGV[2 * i])
    out[i] = redis.call('PEXPIRE', KEYS[2 * i - 1], ARGV[2 * i])
  end
end
return out
";

/// `body` after the definition of `fence()` and `fence_now()`, floored or not.
fn with_fence(body: &str, floored: bool) -> String {
    if floored {
        format!("{}{body}", floored_fence!())
    } else {
        format!("{}{body}", counter_fence!())
    }
}

pub(super) struct Scripts {
    pub(super) acquire: Lua,
    pub(super) release: Lua,
    pub(super) release_alone: Lua,
    pub(super) reserve: Lua,
    pub(super) take: Lua,
    pub(super) force_release: Lua,
    pub(super) extend: Lua,
    pub(super) extend_many: Lua,
    pub(super) inspect: Lua,
    pub(super) leave: Lua,
    pub(super) kind_acquire: Lua,
    pub(super) kind_release: Lua,
    pub(super) kind_extend: Lua,
    /// [`FENCE_HELD`], the uncontended acquisition's fence.
    pub(super) fence_held: Lua,
    /// [`OWN`] and [`OWN_EXTEND`], the mutex holder's description on Redis Cluster.
    pub(super) own: Lua,
    pub(super) own_extend: Lua,
}

impl Scripts {
    /// The scripts; `floored` for a topology whose failovers can lose writes (Redis Cluster),
    /// where every fence (of every kind) is floored at the server clock.
    pub(super) fn new(floored: bool) -> Self {
        Scripts {
            acquire: Lua::with_queue(ACQUIRE, floored),
            release: Lua::with_queue_after(RELEASE_FAST, RELEASE, floored),
            release_alone: Lua::new(RELEASE_ALONE),
            reserve: Lua::new(RESERVE),
            take: Lua::new(&with_fence(TAKE, floored)),
            force_release: Lua::with_kinds(FORCE_RELEASE, floored),
            leave: Lua::with_queue(LEAVE, floored),
            extend: Lua::new(EXTEND),
            extend_many: Lua::new(EXTEND_MANY),
            inspect: Lua::with_kinds(INSPECT, floored),
            kind_acquire: Lua::with_kinds_after(KIND_ACQUIRE_FAST, KIND_ACQUIRE, floored),
            kind_release: Lua::with_kinds_after(KIND_RELEASE_FAST, KIND_RELEASE, floored),
            kind_extend: Lua::new(KIND_EXTEND),
            fence_held: Lua::new(&with_fence(FENCE_HELD, floored)),
            own: Lua::new(OWN),
            own_extend: Lua::new(OWN_EXTEND),
        }
    }
}
