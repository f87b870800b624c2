-- cleanup.lua: delete every fixed key of the namespace (destructive).
-- uses: (nothing but the prelude)
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix.
-- Returns: number of keys that existed and were deleted. Dynamic keys
-- (Taskiq results and progress) are removed by the caller with SCAN.
return redis.call('DEL', unpack(KEYS))
