-- stamp.lua: allocate one message ID and record it as the durable high-water
-- mark, without storing a message (generate_timestamp).
-- uses: guard, ids
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 candidate ID (client clock, 19 digits).
-- Returns: the allocated 19-digit ID.
-- Raises (before any write): CLOCK, IDCONFLICT, IDRANGE (see allocate()).
local id = allocate({ARGV[2]}, 1, high_water(namespace_meta('last_ts')))[1]
redis.call('HSET', K_META, 'last_ts', id)
return id
