-- cleanup.lua: delete every fixed key of the namespace (destructive).
-- KEYS: fixed keys (see _lib.lua).
-- ARGV: 1 wake prefix.
-- Returns: number of keys that existed and were deleted. Dynamic keys
-- (Taskiq results and progress) are removed by the caller with SCAN.
return redis.call('DEL', unpack(KEYS))
