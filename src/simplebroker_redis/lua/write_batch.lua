-- write_batch.lua: add several messages (any queues) in one step, all or
-- nothing: the group commit of concurrent asyncio writers (AsyncMessages).
-- uses: guard, members, bulk, ids, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 candidate ID of the first message (client clock,
--       19 digits), then triples (queue, body, delay in us; '0' = now).
-- Returns: the committed 19-digit IDs, in argument order (consecutive above
-- the first; see allocate() in lib/ids.lua).
-- Raises (before any write): UNINITIALIZED/FOREIGN/SCHEMA/WRONGTYPE, CLOCK,
-- IDCONFLICT, IDRANGE. One wake-up is published per queue written.
check_ns({K_QUEUES, K_PENDING, K_DELAYED, K_DUE, K_BODIES})
local count = (#ARGV - 2) / 3
if count < 1 or count ~= math.floor(count) then fail('ARG', 'expected (queue, body, delay) triples') end
local ids = allocate({ARGV[2]}, count)
local now = nil
local queues, order = {}, {}
local fields, pending = {}, {}
for i = 1, count do
  local at = 3 * i
  local queue, delay = ARGV[at], tonumber(ARGV[at + 2])
  local member = mem(queue, ids[i])
  fields[#fields + 1] = ids[i]
  fields[#fields + 1] = ARGV[at + 1]
  if delay > 0 then
    now = now or now_us()
    redis.call('ZADD', K_DELAYED, 0, member)
    redis.call('ZADD', K_DUE, string.format('%.0f', now + delay), member)
  else
    pending[#pending + 1] = member
  end
  if not queues[queue] then
    queues[queue] = true
    order[#order + 1] = queue
  end
end
for i = 1, #fields, 2 * CHUNK do
  redis.call('HSET', K_BODIES, unpack(fields, i, math.min(i + 2 * CHUNK - 1, #fields)))
end
zadd_all(K_PENDING, pending)
for _, queue in ipairs(order) do register(queue) end
redis.call('HSET', K_META, 'last_ts', ids[count])
for _, queue in ipairs(order) do wake(queue) end
return ids
