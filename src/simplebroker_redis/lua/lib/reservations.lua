-- lib/reservations.lua: tokens, their records, settling, releasing and
-- recovering reserved messages.
-- uses: guard, members, bulk
--
-- A reservation is a token: tokens[token] holds its JSON record {q, t, c,
-- d, l, m, x} (queue, move target, created us, deadline us or -1, lease us,
-- max deliveries, dead-letter queue), token_ids holds "<token> <id>" per
-- reserved id, owners[id] = token, and leases scores the token by deadline.

local function token_members(token)
  return redis.call('ZRANGE', K_TOKEN_IDS, '[' .. token .. ' ', '(' .. token .. '!', 'BYLEX')
end

local function drop_token(token)
  redis.call('HDEL', K_TOKENS, token)
  redis.call('ZREM', K_LEASES, token)
end

-- Forget the token once it holds no more IDs.
local function drop_token_if_empty(token)
  if not redis.call('ZRANGE', K_TOKEN_IDS, '[' .. token .. ' ', '(' .. token .. '!',
      'BYLEX', 'LIMIT', 0, 1)[1] then
    drop_token(token)
  end
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

-- Raise ARG unless `mode` is a settlement mode.
local function check_mode(mode)
  if mode ~= 'claim' and mode ~= 'delete' and mode ~= 'move' then
    fail('ARG', 'settlement mode ' .. tostring(mode))
  end
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

-- The IDs a settlement names: ARGV[first..], or every ID the token holds
-- when that is the single argument '*'.
local function selected_ids(token, first)
  if ARGV[first] == '*' then return ids_of(token_members(token)) end
  local ids = {}
  for i = first, #ARGV do ids[#ids + 1] = ARGV[i] end
  return ids
end

-- Settle `ids` of a token whose `record` was read: 'claim' marks them
-- consumed, 'delete' removes them, 'move' makes them pending in `target`.
-- IDs the token no longer holds are counted as lost and left alone. The
-- caller validated mode and target. Returns settled, lost.
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
  drop_token_if_empty(token)
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
  drop_token_if_empty(token)
  return #moved + #dead
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
  return release_ids(token, record, ids_of(token_members(token)), 0, false)
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
