-- vacuum.lua: physically remove up to `batch` claimed messages (oldest queue
-- names first), so large vacuums never block the server for long.
-- uses: guard, upkeep
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 batch size.
-- Returns: {removed, claimed messages left}.
-- Raises (before any write): WRONGTYPE for a key of the wrong type.
check_keys({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_DUE, K_CLAIMED, K_BODIES,
  K_DELIVERIES})
local removed = purge_claimed(tonumber(ARGV[2]))
return {removed, redis.call('ZCARD', K_CLAIMED)}
