-- delete_queues.lua: physically delete messages (any state but reserved) of
-- the given queues, optionally only IDs below a bound, all or nothing.
-- uses: guard, members, upkeep
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 before ('' = every ID, else 19 digits, exclusive),
--       3.. queue names.
-- Returns: number of messages deleted.
-- Raises (before any write): RESERVED when a selected message is reserved.
local before = ARGV[2]
check_keys({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_DUE, K_CLAIMED, K_BODIES, K_DELIVERIES})
for i = 3, #ARGV do
  local lo, hi = bounds(ARGV[i], '', before)
  if redis.call('ZRANGE', K_RESERVED, lo, hi, 'BYLEX', 'LIMIT', 0, 1)[1] then
    fail('RESERVED', 'queue ' .. ARGV[i] .. ' has reserved messages')
  end
end
local deleted = 0
for i = 3, #ARGV do
  local queue = ARGV[i]
  local lo, hi = bounds(queue, '', before)
  for _, key in ipairs({K_PENDING, K_DELAYED, K_CLAIMED}) do
    deleted = deleted + purge(key, redis.call('ZRANGE', key, lo, hi, 'BYLEX'))
  end
  unregister_if_empty(queue)
end
return deleted
