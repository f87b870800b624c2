-- _lib.lua: shared prelude, prepended to every script by scripts.py.
--
-- KEYS (every script): the namespace's fixed keys, in the order of
-- keys.Keyspace.fixed_keys:
--   1 meta  2 queues  3 pending  4 reserved  5 delayed  6 due  7 claimed
--   8 bodies  9 deliveries  10 owners  11 tokens  12 token_ids  13 leases
--   14 aliases  15 schedules
-- ARGV[1] (every script): the Pub/Sub wake-up channel prefix of the namespace.
--
-- Members of the lex-ordered sets are "<queue> <19-digit id>"; the members of
-- one queue are the range ["q ", "q!"). Errors are raised as
-- "SBR_<CODE> <detail>" and translated by errors.py. Every script validates
-- before its first write, so a raised error never leaves a partial change.

local K_META, K_QUEUES, K_PENDING, K_RESERVED = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_DELAYED, K_DUE, K_CLAIMED, K_BODIES = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_DELIVERIES, K_OWNERS, K_TOKENS = KEYS[9], KEYS[10], KEYS[11]
local K_TOKEN_IDS, K_LEASES, K_ALIASES = KEYS[12], KEYS[13], KEYS[14]
local WAKE_PREFIX = ARGV[1]

local MAGIC = 'simplebroker-redis'
local SCHEMA = '1'
local ZERO_ID = '0000000000000000000'
-- Largest storable message ID: 2^63 - 1 (SimpleBroker's exclusive bound is 2^63).
local MAX_ID = '9223372036854775807'
local CHUNK = 1000

local KEY_TYPES = {
  [KEYS[1]] = 'hash', [KEYS[2]] = 'zset', [KEYS[3]] = 'zset', [KEYS[4]] = 'zset',
  [KEYS[5]] = 'zset', [KEYS[6]] = 'zset', [KEYS[7]] = 'zset', [KEYS[8]] = 'hash',
  [KEYS[9]] = 'hash', [KEYS[10]] = 'hash', [KEYS[11]] = 'hash', [KEYS[12]] = 'zset',
  [KEYS[13]] = 'zset', [KEYS[14]] = 'hash', [KEYS[15]] = 'hash',
}

local function fail(code, detail)
  error({err = 'SBR_' .. code .. ' ' .. (detail or '')})
end

-- Reject keys of the wrong type before anything is written.
local function check_keys(list)
  for _, key in ipairs(list) do
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'none' and kind ~= KEY_TYPES[key] then
      fail('WRONGTYPE', key .. ' holds a ' .. kind .. ', expected a ' .. KEY_TYPES[key])
    end
  end
end

-- Verify the namespace is initialized by this product and schema, then types.
local function check_ns(list)
  local kind = redis.call('TYPE', K_META)['ok']
  if kind == 'none' then fail('UNINITIALIZED', K_META) end
  if kind ~= 'hash' then fail('WRONGTYPE', K_META .. ' holds a ' .. kind .. ', expected a hash') end
  local meta = redis.call('HMGET', K_META, 'magic', 'schema_version')
  if meta[1] ~= MAGIC then fail('FOREIGN', K_META .. ' magic is ' .. tostring(meta[1])) end
  if meta[2] ~= SCHEMA then fail('SCHEMA', tostring(meta[2])) end
  check_keys(list)
end

-- Member and range helpers ---------------------------------------------------
local function mem(queue, id) return queue .. ' ' .. id end
local function mid(member) return string.sub(member, -19) end
local function mqueue(member) return string.sub(member, 1, -21) end
local function qlo(queue) return '[' .. queue .. ' ' end
local function qhi(queue) return '(' .. queue .. '!' end

-- Lex bounds of a queue, optionally restricted to after < id < before.
local function bounds(queue, after, before)
  local lo = qlo(queue)
  local hi = qhi(queue)
  if after ~= '' then lo = '(' .. queue .. ' ' .. after end
  if before ~= '' then hi = '(' .. queue .. ' ' .. before end
  return lo, hi
end

local function range(key, lo, hi, order, limit)
  if order == 'newest' then
    return redis.call('ZRANGE', key, hi, lo, 'BYLEX', 'REV', 'LIMIT', 0, limit)
  end
  return redis.call('ZRANGE', key, lo, hi, 'BYLEX', 'LIMIT', 0, limit)
end

-- Merge several member lists of one queue, each sorted in `order`, keeping
-- the first `limit`; returns merged members and the index of their source.
local function merge(lists, order, limit)
  local out, src = {}, {}
  local pos = {}
  for i = 1, #lists do pos[i] = 1 end
  while #out < limit do
    local best, best_i = nil, nil
    for i = 1, #lists do
      local candidate = lists[i][pos[i]]
      if candidate then
        local id = mid(candidate)
        if best == nil or (order == 'newest' and id > best) or (order ~= 'newest' and id < best) then
          best, best_i = id, i
        end
      end
    end
    if best_i == nil then break end
    out[#out + 1] = lists[best_i][pos[best_i]]
    src[#src + 1] = best_i
    pos[best_i] = pos[best_i] + 1
  end
  return out, src
end

local function first_in(key, queue)
  return redis.call('ZRANGE', key, qlo(queue), qhi(queue), 'BYLEX', 'LIMIT', 0, 1)[1]
end

local function lexcount(key, queue)
  return redis.call('ZLEXCOUNT', key, qlo(queue), qhi(queue))
end

-- A queue exists while it holds a message in any state.
local function has_rows(queue)
  return first_in(K_PENDING, queue) or first_in(K_RESERVED, queue)
    or first_in(K_DELAYED, queue) or first_in(K_CLAIMED, queue)
end

local function register(queue) redis.call('ZADD', K_QUEUES, 0, queue) end

local function unregister_if_empty(queue)
  if not has_rows(queue) then redis.call('ZREM', K_QUEUES, queue) end
end

local function wake(queue) redis.call('PUBLISH', WAKE_PREFIX .. queue, '1') end

-- Bulk commands, chunked below Lua's unpack limit -----------------------------
local function zadd_all(key, members)
  for i = 1, #members, CHUNK do
    local args = {}
    for j = i, math.min(i + CHUNK - 1, #members) do
      args[#args + 1] = 0
      args[#args + 1] = members[j]
    end
    redis.call('ZADD', key, unpack(args))
  end
end

local function zrem_all(key, members)
  for i = 1, #members, CHUNK do
    redis.call('ZREM', key, unpack(members, i, math.min(i + CHUNK - 1, #members)))
  end
end

local function hdel_all(key, fields)
  for i = 1, #fields, CHUNK do
    redis.call('HDEL', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
  end
end

local function bodies_of(members)
  local out = {}
  for i = 1, #members, CHUNK do
    local ids = {}
    for j = i, math.min(i + CHUNK - 1, #members) do ids[#ids + 1] = mid(members[j]) end
    local got = redis.call('HMGET', K_BODIES, unpack(ids))
    for j = 1, #got do
      if not got[j] then fail('CORRUPT', 'message ' .. ids[j] .. ' has no body') end
      out[#out + 1] = got[j]
    end
  end
  return out
end

-- The distinct queues of a member list, in first-seen order.
local function queues_of(members)
  local out, seen = {}, {}
  for _, member in ipairs(members) do
    local queue = mqueue(member)
    if not seen[queue] then
      seen[queue] = true
      out[#out + 1] = queue
    end
  end
  return out
end

local function ids_of(members)
  local ids = {}
  for i = 1, #members do ids[i] = mid(members[i]) end
  return ids
end

-- Message-ID arithmetic on 19-digit decimal strings (IDs exceed 2^53) ---------
local function id_mod4096(id)
  local r = 0
  for i = 1, #id do r = (r * 10 + string.byte(id, i) - 48) % 4096 end
  return r
end

local function id_incr(id)
  local digits = {string.byte(id, 1, -1)}
  local i = #digits
  while i >= 1 do
    if digits[i] == 57 then
      digits[i] = 48
      i = i - 1
    else
      digits[i] = digits[i] + 1
      break
    end
  end
  if i == 0 then fail('IDRANGE', 'message ID overflow') end
  return string.char(unpack(digits))
end

-- The durable high-water mark; raises CORRUPT unless it is 19 digits.
local function last_ts()
  local value = redis.call('HGET', K_META, 'last_ts') or ZERO_ID
  if #value ~= 19 or not string.find(value, '^%d+$') then
    fail('CORRUPT', K_META .. ' last_ts is not a 19-digit message ID')
  end
  return value
end

-- Allocate `count` increasing IDs above the durable high-water mark.
-- `candidates` are the client's hybrid timestamps (its clock), strictly
-- increasing. A candidate that names a stored message is refused (IDCONFLICT,
-- the client backs off and retries); a stale one (at or below the high-water)
-- is replaced by the next free ID, so a client with a lagging clock still
-- writes in one round trip. A single ID whose logical counter would overflow
-- fails with CLOCK, as SimpleBroker's generator does; a multi-ID allocation
-- may borrow the following 4.096 us grains. Beyond the candidates given,
-- IDs are consecutive.
local function allocate(candidates, count)
  for i, candidate in ipairs(candidates) do
    if i > 1 and candidate <= candidates[i - 1] then fail('DUPCANDIDATE', candidate) end
    if redis.call('HEXISTS', K_BODIES, candidate) == 1 then fail('IDCONFLICT', candidate) end
  end
  local floor = last_ts()
  local ids = {}
  for i = 1, count do
    local candidate = candidates[i]
    if candidate and candidate > floor then
      ids[i] = candidate
    else
      if count == 1 and id_mod4096(floor) == 4095 then fail('CLOCK', floor) end
      ids[i] = id_incr(floor)
      if redis.call('HEXISTS', K_BODIES, ids[i]) == 1 then fail('IDCONFLICT', ids[i]) end
    end
    floor = ids[i]
  end
  if ids[count] > MAX_ID then fail('IDRANGE', 'timestamp too far in future') end
  return ids
end

-- Server time in integer microseconds (exact in a double until year 2255).
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Reservations ------------------------------------------------------------------
local function token_members(token)
  return redis.call('ZRANGE', K_TOKEN_IDS, '[' .. token .. ' ', '(' .. token .. '!', 'BYLEX')
end

local function drop_token(token)
  redis.call('HDEL', K_TOKENS, token)
  redis.call('ZREM', K_LEASES, token)
end

-- Decode a token's record. Returns nil when the token does not exist, and
-- raises CORRUPT when the record is damaged (not JSON, or fields missing).
local function read_record(token)
  local raw = redis.call('HGET', K_TOKENS, token)
  if not raw then return nil end
  local ok, record = pcall(cjson.decode, raw)
  if not ok or type(record) ~= 'table' or type(record.q) ~= 'string'
    or tonumber(record.d) == nil or tonumber(record.l) == nil then
    fail('CORRUPT', 'reservation ' .. token .. ' has a damaged record')
  end
  return record
end

-- A message's delivery count; raises CORRUPT when it is not a count.
local function delivery_count(id)
  local raw = redis.call('HGET', K_DELIVERIES, id)
  if not raw then return 0 end
  local count = tonumber(raw)
  if not count or count < 0 or count ~= math.floor(count) then
    fail('CORRUPT', 'message ' .. id .. ' has a damaged delivery count')
  end
  return count
end

-- The target queue of a settlement: `target`, or the one recorded at
-- reserve time when it is ''. Raises ARG for a move without a usable target.
local function settle_target(record, mode, target)
  if target == '' then target = record.t end
  if mode == 'move' and (not target or target == '' or target == record.q) then
    fail('ARG', 'move needs a target queue')
  end
  return target
end

-- Settle `ids` of a token whose `record` was read (see settle.lua): 'claim'
-- marks them consumed, 'delete' removes them, 'move' makes them pending in
-- `target`. IDs the token no longer holds are counted as lost and left
-- alone. The caller validated mode and target. Returns settled, lost.
local function settle_ids(token, record, mode, target, ids)
  local queue = record.q
  local done, drop, lost = {}, {}, 0
  for _, id in ipairs(ids) do
    if redis.call('HGET', K_OWNERS, id) == token
      and redis.call('ZSCORE', K_RESERVED, mem(queue, id)) then
      done[#done + 1] = id
      drop[#drop + 1] = token .. ' ' .. id
    else
      lost = lost + 1
    end
  end
  local members = {}
  for i, id in ipairs(done) do members[i] = mem(queue, id) end
  zrem_all(K_RESERVED, members)
  hdel_all(K_OWNERS, done)
  zrem_all(K_TOKEN_IDS, drop)
  if mode == 'claim' then
    zadd_all(K_CLAIMED, members)
  elseif mode == 'delete' then
    hdel_all(K_BODIES, done)
    hdel_all(K_DELIVERIES, done)
    unregister_if_empty(queue)
  else
    local moved = {}
    for i, id in ipairs(done) do moved[i] = mem(target, id) end
    zadd_all(K_PENDING, moved)
    if #moved > 0 then
      register(target)
      wake(target)
    end
    unregister_if_empty(queue)
  end
  if not redis.call('ZRANGE', K_TOKEN_IDS, '[' .. token .. ' ', '(' .. token .. '!',
      'BYLEX', 'LIMIT', 0, 1)[1] then
    drop_token(token)
  end
  return #done, lost
end

-- Return reserved `ids` of a token to pending, or to delayed until `due`
-- (server us). Only IDs still owned by `token` move, so a stale caller can
-- never release a newer reservation of the same message. `undeliver` takes
-- back the delivery count (the messages never reached a handler). A message
-- that used up the record's max deliveries goes to its dead-letter queue.
-- Validates everything before its first write. Returns the number moved.
local function release_ids(token, record, ids, due, undeliver)
  local queue = record.q
  local max_deliveries = tonumber(record.m or '0') or 0
  local owned, counts, drop = {}, {}, {}
  for _, id in ipairs(ids) do
    if redis.call('HGET', K_OWNERS, id) == token
      and redis.call('ZSCORE', K_RESERVED, mem(queue, id)) then
      owned[#owned + 1] = id
      counts[#owned] = delivery_count(id)
    end
    drop[#drop + 1] = token .. ' ' .. id
  end
  local moved, dead = {}, {}
  for i, id in ipairs(owned) do
    local member = mem(queue, id)
    local count = counts[i]
    redis.call('ZREM', K_RESERVED, member)
    redis.call('HDEL', K_OWNERS, id)
    if undeliver and count > 0 then
      count = redis.call('HINCRBY', K_DELIVERIES, id, -1)
    end
    if not undeliver and max_deliveries > 0 and record.x ~= '' and count >= max_deliveries then
      dead[#dead + 1] = member
    else
      moved[#moved + 1] = member
    end
  end
  zrem_all(K_TOKEN_IDS, drop)
  if #moved > 0 then
    if due and due > 0 then
      zadd_all(K_DELAYED, moved)
      for _, member in ipairs(moved) do
        redis.call('ZADD', K_DUE, string.format('%.0f', due), member)
      end
    else
      zadd_all(K_PENDING, moved)
    end
    wake(queue)
  end
  if #dead > 0 then
    local renamed = {}
    for i, member in ipairs(dead) do renamed[i] = mem(record.x, mid(member)) end
    zadd_all(K_PENDING, renamed)
    register(record.x)
    unregister_if_empty(queue)
    wake(record.x)
  end
  if not redis.call('ZRANGE', K_TOKEN_IDS, '[' .. token .. ' ', '(' .. token .. '!',
      'BYLEX', 'LIMIT', 0, 1)[1] then
    drop_token(token)
  end
  return #moved + #dead
end

local function release_token(token, record)
  return release_ids(token, record, ids_of(token_members(token)), 0, false)
end

-- Recover one expired token; returns IDs released, or -1 when it was skipped.
local function recover_token(token, now, queue)
  local record = read_record(token)
  if not record then
    redis.call('ZREM', K_LEASES, token)
    return -1
  end
  local deadline = tonumber(record.d)
  if (queue ~= '' and record.q ~= queue) or deadline < 0 or deadline >= now then
    return -1
  end
  return release_token(token, record)
end

-- Release every reservation whose lease deadline is before `now` (at most
-- `max_tokens` of them, optionally only those of `queue`). Age is qualified
-- in exact integer microseconds of server time, re-read from the token's own
-- record. A damaged token raises CORRUPT, unless `lenient` (the upkeep that
-- starts every claim), which skips it so one bad record cannot stop every
-- reader of the namespace; each token validates before it writes, so a
-- skipped token changed nothing. Returns {IDs released, tokens, more left}.
local function recover_expired(now, queue, max_tokens, lenient)
  local tokens = redis.call('ZRANGE', K_LEASES, '-inf', '(' .. string.format('%.0f', now),
    'BYSCORE', 'LIMIT', 0, max_tokens)
  local released, recovered = 0, 0
  for _, token in ipairs(tokens) do
    local ok, got
    if lenient then
      ok, got = pcall(recover_token, token, now, queue)
    else
      ok, got = true, recover_token(token, now, queue)
    end
    if ok and got >= 0 then
      released = released + got
      recovered = recovered + 1
    end
  end
  local more = 0
  if #tokens == max_tokens then more = 1 end
  return {released, recovered, more}
end

-- Make delayed messages whose due time has passed claimable again.
local function promote_due(now, limit)
  local members = redis.call('ZRANGE', K_DUE, '-inf', string.format('%.0f', now), 'BYSCORE', 'LIMIT', 0, limit)
  if #members == 0 then return 0 end
  zrem_all(K_DUE, members)
  zrem_all(K_DELAYED, members)
  zadd_all(K_PENDING, members)
  for _, queue in ipairs(queues_of(members)) do wake(queue) end
  return #members
end

-- Delete messages (members of `key`) of one queue: bodies and delivery counts
-- go with them. Caller checks reservations first.
local function purge(key, members)
  if #members == 0 then return 0 end
  local ids = ids_of(members)
  zrem_all(key, members)
  hdel_all(K_BODIES, ids)
  hdel_all(K_DELIVERIES, ids)
  if key == K_DELAYED then zrem_all(K_DUE, members) end
  return #members
end

-- Automatic maintenance, asked for by the client every AUTO_VACUUM_INTERVAL
-- committed messages (SimpleBroker's MaintenanceSchedule) and carried by the
-- next write, claim or reservation instead of costing round trips of its
-- own. `spec` is '' (not due) or '<batch>:<threshold fraction>:<limit>': when
-- vacuum is eligible (claimed >= total * threshold, or more than `limit`
-- claimed), up to `batch` claimed messages are removed. Expired
-- reservations are recovered too. Best effort: a failure changes nothing
-- for the operation that carries it.
local function purge_claimed(batch)
  local members = redis.call('ZRANGE', K_CLAIMED, 0, batch - 1)
  local removed = purge(K_CLAIMED, members)
  for _, queue in ipairs(queues_of(members)) do unregister_if_empty(queue) end
  return removed
end

local function vacuum_step(spec)
  local batch, threshold, limit = string.match(spec, '^(%d+):([%d.]+):(%d+)$')
  if not batch then return end
  recover_expired(now_us(), '', 16, true)
  local claimed = redis.call('ZCARD', K_CLAIMED)
  local total = claimed + redis.call('ZCARD', K_PENDING) + redis.call('ZCARD', K_RESERVED)
    + redis.call('ZCARD', K_DELAYED)
  if total > 0 and (claimed >= total * tonumber(threshold) or claimed > tonumber(limit)) then
    purge_claimed(tonumber(batch))
  end
end

local function maintain(spec)
  if spec and spec ~= '' then pcall(vacuum_step, spec) end
end

-- Opportunistic upkeep run at the start of every claim or reservation.
local function upkeep()
  local now = now_us()
  recover_expired(now, '', 16, true)
  promote_due(now, 256)
  return now
end
