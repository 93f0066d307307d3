//! The scripts of the read-write lock and the semaphore (and the helpers they share), which
//! `scripts.rs` assembles after the queue helpers.

/// Helpers of the read-write lock and the semaphore, after the queue helpers
/// (`scripts::QUEUE`). `KEYS[5]` is where the names of reader timeout keys start: `{<lock key>}`, or the lock key itself when it contains
/// a `{` (Redisson's rule, see `keys::redisson_prefix`).
///
/// - `ttl_key(field, k)`: the timeout key of a reader's `k`-th hold,
///   `<KEYS[5]>:<field>:rwlock_timeout:<k>`. A distlock reader's field is its token (32 hex
///   digits) and it has one hold (`k = 1`); Redisson's is `<uuid>:<thread id>` with a
///   reentrant count.
/// - `scan_readers(all, longest, longer, dead)`: goes through the fields of `all` (the lock
///   hash's `HGETALL`): counts the live readers and the other holder fields, folds the lease
///   left of each live reader timeout key into `longest` where `longer(left, longest)` says
///   so, and calls `dead(field)` for each reader none of whose timeout keys is left.
/// - `prune_readers()`: drops the reader fields none of whose timeout keys is left (a reader,
///   ours or Redisson's, whose lease ran out), so a crashed reader's share goes after its own
///   lease whoever else renews; returns the live readers, the other holder fields (writers:
///   `...:write`, whose lease is the hash's) and the longest reader lease left in ms.
/// - `prune_permits()`: drops the permits whose expiry (server ms, field value
///   `<expiry>:<slot>`) has passed; returns the live permits, the slots they use, the soonest
///   and the longest lease left in ms.
/// - `queue_allows(member, kind, fifo, free)`: whether the wait queue lets this attempt take
///   the key now: a reader waits for every earlier waiter that is not a reader (the writer
///   preference: a waiting mutex, writer or permit taker keeps new readers out, also without
///   `fifo`); a permit taker for fewer earlier waiters than `free` permits, all of them permit
///   takers; with `fifo` an exclusive attempt for nobody (it must be the head). An attempt
///   that is not queued counts everybody queued as earlier. Expired places on the way are
///   dropped. Also returns whether anybody was queued (else there is no place to give up).
/// - `join(member, ttl, lease, kind, desc)`: joins the queue or keeps the place, with the
///   waiter's owner description beside it (see `scripts::ACQUIRE`).
/// - A reader or permit pruned also loses its description in the owners hash (`OWNERS`, the
///   last key, see `scripts::QUEUE`).
pub(super) const KINDS: &str = r"
local function ttl_key(field, k)
  return KEYS[5] .. ':' .. field .. ':rwlock_timeout:' .. k
end
local function writer_field(f)
  return string.sub(f, -6) == ':write'
end
local function scan_readers(all, longest, longer, dead)
  local readers, others = 0, 0
  for i = 1, #all, 2 do
    local f = all[i]
    if f ~= 'mode' then
      local n = tonumber(all[i + 1])
      if writer_field(f) or not n then
        others = others + 1
      else
        local alive = false
        for k = n, 1, -1 do
          local left = redis.call('PTTL', ttl_key(f, k))
          if left ~= -2 then
            alive = true
            if longer(left, longest) then longest = left end
          end
        end
        if alive then readers = readers + 1 else dead(f) end
      end
    end
  end
  return readers, others, longest
end
local function prune_readers()
  return scan_readers(
    redis.call('HGETALL', KEYS[1]),
    0,
    function(left, longest) return left > longest end,
    function(f)
      redis.call('HDEL', KEYS[1], f)
      redis.call('HDEL', OWNERS, f)
    end
  )
end
local function prune_permits()
  local all = redis.call('HGETALL', KEYS[1])
  local live, used, soonest, longest = 0, {}, nil, 0
  for i = 1, #all, 2 do
    local f = all[i]
    if f ~= 'mode' and f ~= 'permits' then
      local expiry, slot = string.match(all[i + 1], '^(%d+):(%d+)$')
      local left = tonumber(expiry or '0') - clock()
      if left > 0 then
        live = live + 1
        used[tonumber(slot)] = true
        if not soonest or left < soonest then soonest = left end
        if left > longest then longest = left end
      else
        redis.call('HDEL', KEYS[1], f)
        redis.call('HDEL', OWNERS, f)
      end
    end
  end
  return live, used, soonest, longest
end
local function queue_allows(member, kind, fifo, free)
  local ahead = 0
  local queue = redis.call('ZRANGE', KEYS[3], 0, -1)
  for _, e in ipairs(queue) do
    if e == member then return true, true end
    local place = redis.call('HGET', KEYS[4], e) or '0:0'
    local expiry, _, k = string.match(place, '^(%d+):(%d+):?(%a*)$')
    if tonumber(expiry or '0') <= clock() then
      redis.call('ZREM', KEYS[3], e)
      redis.call('HDEL', KEYS[4], e, e .. '|o')
    elseif kind == 'r' then
      if k ~= 'r' then return false end
    elseif kind == 's' then
      ahead = ahead + 1
      if k ~= 's' or ahead >= free then return false end
    elseif fifo then
      return false
    end
  end
  return true, #queue > 0
end
local function join(member, ttl, lease, kind, desc)
  if ttl <= 0 then return end
  redis.call('ZADD', KEYS[3], 'NX', clock_us(), member)
  redis.call('HSET', KEYS[4], member, string.format('%.0f', clock() + ttl) .. ':' .. lease .. ':' .. kind,
    member .. '|o', desc)
  redis.call('PEXPIRE', KEYS[3], ttl * 2)
  redis.call('PEXPIRE', KEYS[4], ttl * 2)
end
";

/// KEYS: lock, fence, queue, waiter places, reader timeout prefix, owners. ARGV: token, lease
/// ms, waiter ttl ms (0: do not queue), queue member, kind (`r` read, `w` write, `s` permit),
/// fifo (`1`; `0` on Redlock), permits, slot (`-1`: the lowest free one), owner description
/// (empty: keep what is recorded). Returns
/// {1, fence, slot} when acquired, {0, retry ms, fence_now} when busy, {2, permits} when the semaphore's
/// holders use another number of permits.
///
/// What is at the lock key decides: nothing (or only holds whose lease ran out) is free; a
/// string (our mutex, a Spring or `SET NX` client) or any other type is busy for every kind; a
/// hash is a Redisson-layout read-write lock (`mode` = `read` or `write`), our semaphore
/// (`mode` = `semaphore`) or a foreign hash without those modes (a Redisson `RLock`), busy.
///
/// - Reader: field `<token>` = `1` and its timeout key `<prefix>:<token>:rwlock_timeout:1`
///   with `PX` = lease, the hash's `PTTL` raised to the lease if shorter, as Redisson's readers
///   do; shares with readers (ours and Redisson's), unless an earlier waiter is not a reader.
/// - Writer: a fresh hash `mode` = `write`, `<token>:write` = `1`, `PEXPIRE` = lease, when the
///   key is free and (fifo) nobody waits before it.
/// - Permit: a hash `mode` = `semaphore`, `permits` = N, `<token>` = `<expiry ms>:<slot>`
///   (expiry from the server's `TIME`), `PTTL` = the longest permit's lease; a free permit
///   when fewer than N live permits and fewer earlier waiters than free permits. The slot is
///   the holder's number below N, unique among live permits: on Redlock a permit counts when a
///   majority of nodes gave it the same slot, so that N slots bound the holders as each
///   slot's majority does.
///
/// A hold that already carries the caller's token (a lost reply, a writer's hand-over) counts
/// as acquired, with its lease set anew and a new fence.
///
/// Every hold taken records the owner description under its token in the owners hash (see
/// `own`); a writer, or the first reader or permit of a free key, replaces what was there.
pub(super) const KIND_ACQUIRE: &str = r"
local token, lease, ttl, member, kind = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local fifo = ARGV[6] == '1'
local function taken(slot, queued, alone)
  if queued ~= false then
    redis.call('ZREM', KEYS[3], member)
    redis.call('HDEL', KEYS[4], member, member .. '|o')
  end
  own(token, ARGV[9], lease, alone)
  return {1, fence(), slot or 0}
end
local function at_least(ms)
  if redis.call('PTTL', KEYS[1]) < ms then redis.call('PEXPIRE', KEYS[1], ms) end
end
local t = redis.call('TYPE', KEYS[1])['ok']
local mode = false
if t == 'hash' then
  mode = redis.call('HGET', KEYS[1], 'mode') or 'foreign'
elseif t == 'string' then
  mode = 'string'
  -- A mutex holder's reservation whose slice has ended (see RELEASE) is a free key.
  local grace = string.match(redis.call('GET', KEYS[1]), '^~%x+:(%d+)$')
  if grace and redis.call('PTTL', KEYS[1]) <= tonumber(grace) then
    redis.call('DEL', KEYS[1])
    mode = false
  end
elseif t ~= 'none' then
  mode = 'string'
end
if mode == 'read' then
  local readers, others = prune_readers()
  if readers + others == 0 then
    redis.call('DEL', KEYS[1])
    mode = false
  end
end
local retry
if kind == 's' then
  local permits = tonumber(ARGV[7])
  local live, used = 0, {}
  if mode == 'semaphore' then
    local soonest
    live, used, soonest = prune_permits()
    if live == 0 then
      redis.call('DEL', KEYS[1])
      mode = false
    else
      local theirs = tonumber(redis.call('HGET', KEYS[1], 'permits') or '0')
      if theirs ~= permits then return {2, theirs} end
      local mine = redis.call('HGET', KEYS[1], token)
      if mine then
        local slot = string.match(mine, ':(%d+)$') or '0'
        redis.call('HSET', KEYS[1], token, string.format('%.0f', clock() + lease) .. ':' .. slot)
        at_least(lease)
        return taken(tonumber(slot))
      end
      retry = soonest
    end
  end
  local allowed, queued = false, false
  if (not mode or mode == 'semaphore') and live < permits then
    allowed, queued = queue_allows(member, 's', fifo, permits - live)
  end
  if allowed then
    local want, slot = tonumber(ARGV[8]), nil
    if want >= 0 then
      if want < permits and not used[want] then slot = want end
    else
      for s = 0, permits - 1 do
        if not used[s] then slot = s break end
      end
    end
    if slot then
      local place = string.format('%.0f', clock() + lease) .. ':' .. slot
      if mode then
        redis.call('HSET', KEYS[1], token, place)
        at_least(lease)
      else
        redis.call('HSET', KEYS[1], 'mode', 'semaphore', 'permits', ARGV[7], token, place)
        redis.call('PEXPIRE', KEYS[1], lease)
      end
      return taken(slot, queued, not mode)
    end
  end
elseif kind == 'r' then
  if mode == 'read' and redis.call('HEXISTS', KEYS[1], token) == 1 then
    redis.call('SET', ttl_key(token, 1), '1', 'PX', lease)
    at_least(lease)
    return taken()
  end
  local allowed, queued = false, false
  if not mode or mode == 'read' then
    allowed, queued = queue_allows(member, 'r', fifo, 0)
  end
  if allowed then
    -- The timeout key first: the hash's expiry, set after it, is never the earlier one.
    redis.call('SET', ttl_key(token, 1), '1', 'PX', lease)
    if mode then
      redis.call('HSET', KEYS[1], token, '1')
      at_least(lease)
    else
      redis.call('HSET', KEYS[1], 'mode', 'read', token, '1')
      redis.call('PEXPIRE', KEYS[1], lease)
    end
    return taken(nil, queued, not mode)
  end
else
  if mode == 'write' and redis.call('HEXISTS', KEYS[1], token .. ':write') == 1 then
    redis.call('PEXPIRE', KEYS[1], lease)
    return taken()
  end
  local allowed, queued = false, false
  if not mode then
    allowed, queued = queue_allows(member, 'w', fifo, 0)
  end
  if allowed then
    redis.call('HSET', KEYS[1], 'mode', 'write', token .. ':write', '1')
    redis.call('PEXPIRE', KEYS[1], lease)
    return taken(nil, queued, true)
  end
end
join(member, ttl, ARGV[2], kind, ARGV[9])
return {0, retry or redis.call('PTTL', KEYS[1]), fence_now()}
";

/// The start of [`KIND_ACQUIRE`], before its helpers are defined: they are thirteen closures
/// made on every call, which cost the server more than an uncontended read does (a read
/// cycle measured 1.19x a mutex cycle with them, `bench/kinds`). A reader that finds the key
/// free and nobody queued takes it as the full script would.
pub(super) const KIND_ACQUIRE_FAST: &str = r"
if ARGV[5] == 'r' and redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  redis.call('SET', KEYS[5] .. ':' .. ARGV[1] .. ':rwlock_timeout:1', '1', 'PX', ARGV[2])
  redis.call('HSET', KEYS[1], 'mode', 'read', ARGV[1], '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('DEL', KEYS[6])
  if ARGV[9] ~= '' then
    redis.call('HSET', KEYS[6], ARGV[1], ARGV[9])
    redis.call('PEXPIRE', KEYS[6], ARGV[2])
  end
  return {1, fence(), 0}
end
";

/// The start of [`KIND_RELEASE`] (see [`KIND_ACQUIRE_FAST`]): the only reader, with nobody
/// queued, leaves as the full script would have it leave: the key deleted, Redisson's readers
/// and every other waiter told. `pcall`: the key may be of any type.
pub(super) const KIND_RELEASE_FAST: &str = r"
if ARGV[2] == 'r' and redis.call('EXISTS', KEYS[3]) == 0
    and redis.pcall('HGET', KEYS[1], 'mode') == 'read' and redis.call('HLEN', KEYS[1]) == 2 then
  if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
  local was = redis.call('DEL', KEYS[5] .. ':' .. ARGV[1] .. ':rwlock_timeout:1')
  redis.call('PUBLISH', ARGV[6], '0')
  redis.call('DEL', KEYS[1], KEYS[6])
  redis.call('PUBLISH', ARGV[3] .. ':' .. KEYS[1], KEYS[1])
  if ARGV[5] == '1' then redis.call('PUBLISH', ARGV[3], KEYS[1]) end
  return was
end
";

/// KEYS: lock, fence, queue, waiter places, reader timeout prefix, owners. ARGV: token, kind
/// (`r`, `w`, `s`), channel, wake channel prefix, legacy channel, Redisson channel, grants (`0` on
/// Redlock). Returns 1 when the hold was still live and is now gone, 0 otherwise.
///
/// - Reader: its field and timeout key go, dead readers are pruned; while readers remain the
///   hash's `PTTL` becomes the longest of their leases (as Redisson's read unlock computes
///   it) and nothing is published (no waiter can go yet); the last one publishes `0` on the
///   Redisson channel and passes the key on.
/// - Writer: publishes `1` on the Redisson channel and passes the key on.
/// - Permit: its field goes; while permits remain, the hash's `PTTL` becomes the longest of
///   their leases and the release is published on `<channel>:<lock key>` (a permit is free);
///   the last one passes the key on.
///
/// Passing on (see `pass_on`) hands the key to a mutex waiter or writer at the head of the
/// queue, or deletes it and wakes every waiter.
pub(super) const KIND_RELEASE: &str = r"
local token, kind = ARGV[1], ARGV[2]
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return 0 end
local mode = redis.call('HGET', KEYS[1], 'mode')
local was = 1
if kind == 'r' then
  if mode ~= 'read' or redis.call('HDEL', KEYS[1], token) == 0 then return 0 end
  redis.call('HDEL', OWNERS, token)
  was = redis.call('DEL', ttl_key(token, 1))
  if redis.call('HLEN', KEYS[1]) > 1 then
    local readers, others, longest = prune_readers()
    if readers + others > 0 then
      if longest > 0 then redis.call('PEXPIRE', KEYS[1], longest) end
      return was
    end
  end
  redis.call('PUBLISH', ARGV[6], '0')
elseif kind == 'w' then
  if mode ~= 'write' or redis.call('HEXISTS', KEYS[1], token .. ':write') == 0 then return 0 end
  redis.call('PUBLISH', ARGV[6], '1')
else
  if mode ~= 'semaphore' then return 0 end
  local mine = redis.call('HGET', KEYS[1], token)
  if not mine then return 0 end
  redis.call('HDEL', KEYS[1], token)
  redis.call('HDEL', OWNERS, token)
  if tonumber(string.match(mine, '^(%d+)') or '0') <= clock() then was = 0 end
  local live, longest = 0, 0
  if redis.call('HLEN', KEYS[1]) > 2 then
    local n, _, _, l = prune_permits()
    live, longest = n, l
  end
  if live > 0 then
    redis.call('PEXPIRE', KEYS[1], longest)
    redis.call('PUBLISH', ARGV[3] .. ':' .. KEYS[1], KEYS[1])
    return was
  end
end
pass_on(ARGV[3], ARGV[5], ARGV[4], token, ARGV[7] ~= '0')
return was
";

/// KEYS: lock, reader timeout prefix and owners of each hold, in turn. ARGV: token, lease ms
/// and kind (`r`, `w`, `s`) of each hold, in turn. Returns, per hold, 0 when it is no longer held, else
/// 1 (a permit: its slot + 1) with its lease set anew: a reader's own timeout key only (never
/// another reader's, so a crashed reader's share ends with its own lease) and the hash's
/// `PTTL` raised to the lease if shorter; a writer's hash; a permit's expiry. The owners hash
/// is raised to the lease if shorter.
pub(super) const KIND_EXTEND: &str = r"
local now_ms
local out = {}
for i = 1, #KEYS / 3 do
  local key, prefix, owners = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local token, lease, kind = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), ARGV[3 * i]
  out[i] = 0
  if redis.call('TYPE', key)['ok'] == 'hash' then
    local mode = redis.call('HGET', key, 'mode')
    if kind == 'w' then
      if mode == 'write' and redis.call('HEXISTS', key, token .. ':write') == 1 then
        out[i] = redis.call('PEXPIRE', key, lease)
      end
    elseif kind == 'r' then
      if mode == 'read' and redis.call('HEXISTS', key, token) == 1
        and redis.call('PEXPIRE', prefix .. ':' .. token .. ':rwlock_timeout:1', lease) == 1 then
        if redis.call('PTTL', key) < lease then redis.call('PEXPIRE', key, lease) end
        out[i] = 1
      end
    elseif mode == 'semaphore' then
      local mine = redis.call('HGET', key, token)
      if mine then
        if not now_ms then
          local t = redis.call('TIME')
          now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        end
        local expiry, slot = string.match(mine, '^(%d+):(%d+)$')
        if tonumber(expiry or '0') > now_ms then
          redis.call('HSET', key, token, string.format('%.0f', now_ms + lease) .. ':' .. slot)
          if redis.call('PTTL', key) < lease then redis.call('PEXPIRE', key, lease) end
          out[i] = tonumber(slot) + 1
        end
      end
    end
    if out[i] ~= 0 and redis.call('PTTL', owners) < lease then redis.call('PEXPIRE', owners, lease) end
  end
end
return out
";
