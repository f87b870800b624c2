-- resync.lua: repair a high-water mark that fell below a stored message ID
-- (damaged or hand-edited data). Reads every stored ID: O(messages).
-- uses: guard, ids
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix.
-- Returns: {old last_ts, new last_ts}; the mark never moves down.
-- Raises (before any write): UNINITIALIZED, FOREIGN, SCHEMA for a namespace
--         not initialized or not ours; CORRUPT for damaged data.
local old = high_water(namespace_meta('last_ts'))
local highest = old
for _, id in ipairs(redis.call('HKEYS', K_BODIES)) do
  if id > highest then highest = id end
end
if highest > old then redis.call('HSET', K_META, 'last_ts', highest) end
return {old, highest}
