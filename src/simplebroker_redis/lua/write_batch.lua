-- write_batch.lua: add several messages (any queues) in one step, all or
-- nothing: the group commit of concurrent asyncio writers (AsyncMessages).
-- uses: guard, members, bulk, ids, time, counters, tasks
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 candidate ID of the first message (client clock,
--       19 digits), then quadruples (queue, body, delay in us ('0' = now),
--       task index key ('' = none; see lib/tasks.lua)).
-- Returns: the committed 19-digit IDs, in argument order (consecutive above
-- the first; see allocate() in lib/ids.lua).
-- Raises (before any write): UNINITIALIZED/FOREIGN/SCHEMA/WRONGTYPE, CLOCK,
-- IDCONFLICT, IDRANGE. One wake-up is published per queue written.
local count = (#ARGV - 2) / 4
if count < 1 or count ~= math.floor(count) then
  fail('ARG', 'expected (queue, body, delay, task key) quadruples')
end
-- Reads first (each also refuses a wrong-typed key): meta and the candidate
-- ID in bodies; the queues of the batch in the registry.
local ids = allocate({ARGV[2]}, count, high_water(namespace_meta('last_ts')))
local queues, order, delayed = {}, {}, false
for i = 1, count do
  local queue = ARGV[4 * i - 1]
  if not queues[queue] then
    queues[queue] = true
    order[#order + 1] = queue
  end
  if tonumber(ARGV[4 * i + 1]) > 0 then delayed = true end
end
local known = zmscore_all(K_QUEUES, order)
if delayed then check_keys({K_DELAYED, K_DUE}) end

local fields, pending, later = {}, {}, {}
for i = 1, count do
  local at = 4 * i - 1
  local member = mem(ARGV[at], ids[i])
  fields[#fields + 1] = ids[i]
  fields[#fields + 1] = ARGV[at + 1]
  if tonumber(ARGV[at + 2]) > 0 then
    later[#later + 1] = i
  else
    pending[#pending + 1] = member
  end
end
-- The first write: a wrong-typed pending set fails here, before anything changed.
zadd_all(K_PENDING, pending)
if #later > 0 then
  local now = now_us()
  for _, i in ipairs(later) do
    local member = mem(ARGV[4 * i - 1], ids[i])
    redis.call('ZADD', K_DELAYED, 0, member)
    redis.call('ZADD', K_DUE, string.format('%.0f', now + tonumber(ARGV[4 * i + 1])), member)
  end
end
hset_all(K_BODIES, fields)
local indexed = {}
for i = 1, count do indexed[i] = {ARGV[4 * i + 2], ids[i], ARGV[4 * i - 1]} end
index_tasks(indexed)
count_members(pending, 'enqueued')
for _, i in ipairs(later) do count_event(ARGV[4 * i - 1], 'enqueued', 1) end
for i, queue in ipairs(order) do
  if not known[i] then register(queue) end
end
redis.call('HSET', K_META, 'last_ts', ids[count])
for _, queue in ipairs(order) do wake(queue) end
return ids
