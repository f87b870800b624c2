-- alias_remove.lua: remove an alias (if present) and publish a new alias
-- version. Messages are untouched.
-- uses: guard
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 alias, 3 new alias version.
-- Returns: 1 when the alias existed, else 0.
-- Raises (before any write): UNINITIALIZED, FOREIGN, SCHEMA for a namespace
--         not initialized or not ours.
namespace_meta()
local removed = redis.call('HDEL', K_ALIASES, ARGV[2])
redis.call('HSET', K_META, 'alias_version', ARGV[3])
return removed
