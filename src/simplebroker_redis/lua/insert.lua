-- insert.lua: insert pending messages with exact, caller-supplied IDs and
-- raise the high-water mark above them, all or nothing.
-- uses: guard, members, ids, counters, tasks
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 required last_ts (19 digits), then quadruples
--       (queue, 19-digit id, body, task index key ('' = none; see
--       lib/tasks.lua)) from ARGV[3].
-- Returns: number of messages inserted.
-- Raises (before any write): DUPLICATE when an ID is already stored.
local required = ARGV[2]
-- Reads first (each also refuses a wrong-typed key).
local floor = high_water(namespace_meta('last_ts'))
for i = 3, #ARGV, 4 do
  if redis.call('HEXISTS', K_BODIES, ARGV[i + 1]) == 1 then fail('DUPLICATE', ARGV[i + 1]) end
end
check_keys({K_QUEUES, K_PENDING})
local queues, order, indexed = {}, {}, {}
local count = 0
for i = 3, #ARGV, 4 do
  local queue, id = ARGV[i], ARGV[i + 1]
  redis.call('HSET', K_BODIES, id, ARGV[i + 2])
  indexed[#indexed + 1] = {ARGV[i + 3], id, queue}
  redis.call('ZADD', K_PENDING, 0, mem(queue, id))
  count_event(queue, 'enqueued', 1)
  if not queues[queue] then
    queues[queue] = true
    order[#order + 1] = queue
    register(queue)
  end
  count = count + 1
end
index_tasks(indexed)
if required > floor then redis.call('HSET', K_META, 'last_ts', required) end
for _, queue in ipairs(order) do wake(queue) end
return count
