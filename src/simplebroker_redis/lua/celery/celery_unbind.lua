-- celery_unbind.lua: remove every binding of one Celery queue (any
-- exchange, any process's), with its lifetime: kombu's queue_delete.
-- uses: guard, celery
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the bindings (hash), 2 the binding deadlines (zset), as in
--       celery_bind.lua.
-- ARGV: 1 wake prefix, 2 the Celery queue name (as bound, not escaped).
-- Returns: the number of bindings removed.
-- Raises (before any write): ARG (a malformed key list), WRONGTYPE.
celery_key_count(2)
local bindings, deadlines = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
if #ARGV ~= 2 then fail('ARG', 'expected a queue name') end
check_kind(bindings, 'hash')
check_kind(deadlines, 'zset')

-- A binding is "<exchange> US <routing key> US <queue>"; the queue is what
-- follows the second separator (a queue name may itself contain one).
local function queue_of(binding)
  local first = string.find(binding, '\031', 1, true)
  local second = first and string.find(binding, '\031', first + 1, true)
  return second and string.sub(binding, second + 1)
end

local gone = {}
for _, binding in ipairs(redis.call('HKEYS', bindings)) do
  if queue_of(binding) == ARGV[2] then gone[#gone + 1] = binding end
end
for _, binding in ipairs(gone) do
  redis.call('HDEL', bindings, binding)
  redis.call('ZREM', deadlines, binding)
end
return #gone
