-- write.lua: allocate an ID and add one message, optionally trimming the
-- queue's pending window (keep_newest) or delaying visibility.
-- uses: guard, members, bulk, ids, upkeep, time, counters, tasks
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       optionally 1 the write's idempotency key (a string: sent:<key>).
-- ARGV: 1 wake prefix, 2 queue, 3 body, 4 candidate ID (client clock, 19
--       digits), 5 keep_newest ('0' = no window), 6 delay in us ('0' = now),
--       7 maintenance spec ('' when not due; see maintain() in lib/upkeep.lua),
--       8 task index key ('' or absent: none; see lib/tasks.lua), 9 how long
--       (ms) the idempotency key is kept (with the key only).
-- Returns: the committed 19-digit message ID; with an idempotency key that
-- a write stored within its window, that write's ID, and nothing changes.
-- Raises (before any write): UNINITIALIZED/FOREIGN/SCHEMA, WRONGTYPE, CLOCK
-- (logical counter exhausted), IDCONFLICT, IDRANGE, RESERVED (keep_newest
-- would displace a reserved message), CORRUPT (a displaced message has no
-- body), ARG (a malformed window). The wake-up is published inside the
-- script, after the insert.
local queue, body, keep, delay = ARGV[2], ARGV[3], tonumber(ARGV[5]), tonumber(ARGV[6])
local sent = KEYS[FIXED_KEYS + 1]
if sent then
  -- A write sent again after its reply was lost (same key): the first one's ID.
  local earlier = redis.call('GET', sent)
  if earlier then return earlier end
  if not string.find(ARGV[9] or '', '^[1-9]%d*$') then fail('ARG', 'idempotency window') end
end
-- Reads first (each also refuses a wrong-typed key): meta, the candidate ID
-- in bodies, the queue in the registry.
local floor = high_water(namespace_meta('last_ts'))
local id = allocate({ARGV[4]}, 1, floor)[1]
local registered = redis.call('ZSCORE', K_QUEUES, queue)

local displaced = {}
if keep > 0 then
  local lo, hi = qlo(queue), qhi(queue)
  local cut = nil
  if keep == 1 then
    cut = hi
  else
    local newest = merge({
      range(K_PENDING, lo, hi, 'newest', keep - 1),
      range(K_RESERVED, lo, hi, 'newest', keep - 1),
      range(K_DELAYED, lo, hi, 'newest', keep - 1),
    }, 'newest', keep - 1)
    if #newest == keep - 1 then cut = '(' .. newest[keep - 1] end
  end
  if cut then
    if redis.call('ZRANGE', K_RESERVED, lo, cut, 'BYLEX', 'LIMIT', 0, 1)[1] then
      fail('RESERVED', 'keep_newest would displace a reserved message of ' .. queue)
    end
    displaced.pending = redis.call('ZRANGE', K_PENDING, lo, cut, 'BYLEX')
    displaced.delayed = redis.call('ZRANGE', K_DELAYED, lo, cut, 'BYLEX')
    for _, list in pairs(displaced) do
      for _, member in ipairs(list) do
        if redis.call('HEXISTS', K_BODIES, mid(member)) == 0 then
          fail('CORRUPT', 'message ' .. mid(member) .. ' has no body')
        end
      end
    end
  end
  check_keys({K_CLAIMED, K_DUE})
end

local member = mem(queue, id)
if delay > 0 then
  check_keys({K_DELAYED, K_DUE})
  redis.call('ZADD', K_DELAYED, 0, member)
  redis.call('ZADD', K_DUE, string.format('%.0f', now_us() + delay), member)
else
  -- The first write: a wrong-typed pending set fails here, before anything changed.
  redis.call('ZADD', K_PENDING, 0, member)
end
redis.call('HSET', K_BODIES, id, body)
index_task(ARGV[8] or '', id, queue)
if not registered then register(queue) end
redis.call('HSET', K_META, 'last_ts', id)
if displaced.pending and #displaced.pending > 0 then
  zrem_all(K_PENDING, displaced.pending)
  zadd_all(K_CLAIMED, displaced.pending)
end
if displaced.delayed and #displaced.delayed > 0 then
  zrem_all(K_DELAYED, displaced.delayed)
  zrem_all(K_DUE, displaced.delayed)
  zadd_all(K_CLAIMED, displaced.delayed)
end
if sent then redis.call('SET', sent, id, 'PX', ARGV[9]) end
count_event(queue, 'enqueued', 1)
wake(queue)
maintain(ARGV[7])
return id
