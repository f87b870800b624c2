-- alias_add.lua: add an alias after validating the live alias map, and
-- publish the new alias version, in one step. Aliases stay flat: an alias may
-- not target an alias, and an alias target may not become an alias.
-- uses: guard
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 alias, 3 target, 4 new alias version.
-- Returns: 1.
-- Raises (before any write): ALIAS with the reason.
namespace_meta()
local alias, target = ARGV[2], ARGV[3]
if redis.call('HEXISTS', K_ALIASES, alias) == 1 then
  fail('ALIAS', "Alias '" .. alias .. "' already exists")
end
if redis.call('HEXISTS', K_ALIASES, target) == 1 then fail('ALIAS', 'Cannot target another alias') end
local flat = redis.call('HVALS', K_ALIASES)
for _, existing in ipairs(flat) do
  if existing == alias then fail('ALIAS', 'Cannot turn an existing alias target into an alias') end
end
redis.call('HSET', K_ALIASES, alias, target)
redis.call('HSET', K_META, 'alias_version', ARGV[4])
return 1
