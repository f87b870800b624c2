-- celery_exchange_table.lua: the live bindings of one kombu exchange.
-- Bindings whose lifetime ran out (their consumer is gone) are removed
-- first, of every exchange, at most 100 per call; the caller then deletes
-- the messages of their queues.
-- uses: guard, celery, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the bindings (hash), 2 the binding deadlines (zset), as in
--       celery_bind.lua.
-- ARGV: 1 wake prefix, 2 exchange name.
-- Returns: {n, binding 1, value 1, ..., binding n, value n, removed binding ...}.
-- Raises (before any write): ARG (a malformed key list), WRONGTYPE.
celery_key_count(2)
local bindings, deadlines = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
if #ARGV ~= 2 then fail('ARG', 'expected an exchange name') end
check_kind(bindings, 'hash')
check_kind(deadlines, 'zset')

local now_ms = math.floor(now_us() / 1000)
local removed = redis.call('ZRANGE', deadlines, '-inf', now_ms, 'BYSCORE', 'LIMIT', 0, 100)
for _, binding in ipairs(removed) do
  redis.call('HDEL', bindings, binding)
  redis.call('ZREM', deadlines, binding)
end
local prefix = ARGV[2] .. '\031'
local reply = {0}
local all = redis.call('HGETALL', bindings)
for i = 1, #all, 2 do
  if string.sub(all[i], 1, #prefix) == prefix then
    reply[#reply + 1] = all[i]
    reply[#reply + 1] = all[i + 1]
  end
end
reply[1] = (#reply - 1) / 2
for _, binding in ipairs(removed) do reply[#reply + 1] = binding end
return reply
