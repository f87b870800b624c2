-- broadcast.lua: select target queues and insert one copy of a message into
-- each, in one non-interleaved step.
-- uses: guard, members, ids, counters
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 body, 3 mode: 'all' (every queue in the registry
--       now), 'existing' (the given names that are registered now), 'create'
--       (all given names, creating missing queues); 4 n = number of candidate
--       IDs (client clock, 19 digits, increasing) in ARGV[5..4+n]; the queue
--       names follow from ARGV[5+n].
-- Returns: {count, first id, last id}; {0} when nothing was selected, in
-- which case nothing (not even the high-water mark) changes.
-- Raises (before any write): IDCONFLICT, DUPCANDIDATE, IDRANGE and the
-- namespace checks.
local floor = high_water(namespace_meta('last_ts'))
check_keys({K_QUEUES, K_PENDING})
local body, mode, ncand = ARGV[2], ARGV[3], tonumber(ARGV[4])
local candidates = {}
for i = 1, ncand do candidates[i] = ARGV[4 + i] end
local targets = {}
if mode == 'all' then
  targets = redis.call('ZRANGE', K_QUEUES, 0, -1)
else
  for i = 5 + ncand, #ARGV do
    if mode == 'create' or redis.call('ZSCORE', K_QUEUES, ARGV[i]) then
      targets[#targets + 1] = ARGV[i]
    end
  end
end
if #targets == 0 then return {0} end
while #candidates > #targets do candidates[#candidates] = nil end
local ids = allocate(candidates, #targets, floor)
for i, queue in ipairs(targets) do
  redis.call('HSET', K_BODIES, ids[i], body)
  redis.call('ZADD', K_PENDING, 0, mem(queue, ids[i]))
  register(queue)
  count_event(queue, 'enqueued', 1)
end
redis.call('HSET', K_META, 'last_ts', ids[#ids])
for _, queue in ipairs(targets) do wake(queue) end
return {#targets, ids[1], ids[#ids]}
