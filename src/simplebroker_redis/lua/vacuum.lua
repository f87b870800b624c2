-- vacuum.lua: physically remove up to `batch` claimed messages (oldest queue
-- names first), so large vacuums never block the server for long.
-- KEYS: fixed keys (see _lib.lua).
-- ARGV: 1 wake prefix, 2 batch size.
-- Returns: {removed, claimed messages left}.
check_ns({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_CLAIMED, K_BODIES, K_DELIVERIES})
local members = redis.call('ZRANGE', K_CLAIMED, 0, tonumber(ARGV[2]) - 1)
local removed = purge(K_CLAIMED, members)
local seen = {}
for _, member in ipairs(members) do
  local queue = mqueue(member)
  if not seen[queue] then
    seen[queue] = true
    unregister_if_empty(queue)
  end
end
return {removed, redis.call('ZCARD', K_CLAIMED)}
