-- advance_ts.lua: monotone compare-and-advance of the durable high-water mark.
-- uses: guard, ids
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 new last_ts (19 digits).
-- Returns: 1 when last_ts was raised to ARGV[2], 0 when it was already >= it.
-- Raises (before any write): UNINITIALIZED, FOREIGN, SCHEMA for a namespace
--         not initialized or not ours; CORRUPT for damaged data.
if ARGV[2] > high_water(namespace_meta('last_ts')) then
  redis.call('HSET', K_META, 'last_ts', ARGV[2])
  return 1
end
return 0
