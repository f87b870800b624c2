-- delete_ids.lua: physically delete exact message IDs from one queue.
-- Missing IDs and IDs of other queues are ignored.
-- uses: guard, members, upkeep
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue, 3.. 19-digit ids.
-- Returns: number of messages deleted.
-- Raises (before any write): RESERVED when one of the IDs is reserved.
local queue = ARGV[2]
check_keys({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_DUE, K_CLAIMED, K_BODIES, K_DELIVERIES})
for i = 3, #ARGV do
  if redis.call('ZSCORE', K_RESERVED, mem(queue, ARGV[i])) then
    fail('RESERVED', 'message ' .. ARGV[i] .. ' is reserved')
  end
end
local deleted = 0
for i = 3, #ARGV do
  local member = mem(queue, ARGV[i])
  for _, key in ipairs({K_PENDING, K_DELAYED, K_CLAIMED}) do
    if redis.call('ZSCORE', key, member) then
      deleted = deleted + purge(key, {member})
      break
    end
  end
end
unregister_if_empty(queue)
return deleted
