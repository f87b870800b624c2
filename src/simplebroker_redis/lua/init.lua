-- init.lua: create the namespace meta record, or confirm an existing one.
-- uses: guard
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 mode: 'init' creates meta when absent, 'check' only
--       validates.
-- Returns: 'created' (init made meta), 'ready' (valid meta), 'absent'
--          ('check' on an empty namespace), or 'damaged' (meta is not a
--          hash: every operation that reads it reports the damage itself,
--          at once, as DataError).
-- Raises: FOREIGN when meta is missing but message keys exist, or meta
--         belongs to something else; SCHEMA. The types of the other keys
--         are checked by the operations that touch them, not here.
--         (The schedules hash may exist before the namespace does.)
local mode = ARGV[2]
local kind = redis.call('TYPE', K_META)['ok']
if kind == 'none' then
  -- Every fixed key but meta (first) and schedules (last) exists only with meta.
  for i = 2, FIXED_KEYS - 1 do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      fail('FOREIGN', 'namespace holds ' .. KEYS[i] .. ' but has no meta record')
    end
  end
  if mode ~= 'init' then return 'absent' end
  redis.call('HSET', K_META, 'magic', MAGIC, 'schema_version', SCHEMA,
    'last_ts', ZERO_ID, 'alias_version', '0')
  return 'created'
end
if kind ~= 'hash' then return 'damaged' end
namespace_meta()
return 'ready'
