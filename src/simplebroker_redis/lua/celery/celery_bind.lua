-- celery_bind.lua: record kombu exchange bindings that every process of the
-- namespace sees, and (re)start the lifetime of those whose queue expires
-- when unused (Celery's pidbox and reply queues). A consumer's heartbeat
-- runs it again for the queues it consumes, so their bindings live while it
-- does (celery_simplebroker/bindings.py).
-- uses: guard, celery, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the bindings (hash: "<exchange> US <routing key> US <queue>" -> JSON),
--       2 the binding deadlines (zset: binding -> expiry, server milliseconds).
-- ARGV: 1 wake prefix, then triples: binding, JSON value, lifetime in ms
--       ('0' = never expires).
-- Returns: the number of bindings written.
-- Raises (before any write): ARG (a malformed triple or key list), WRONGTYPE.
celery_key_count(2)
local bindings, deadlines = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
local count = (#ARGV - 1) / 3
if count ~= math.floor(count) then fail('ARG', 'expected (binding, value, lifetime) triples') end
local lifetimes = {}
for i = 1, count do lifetimes[i] = lifetime_ms(ARGV[3 * i + 1]) end
check_kind(bindings, 'hash')
check_kind(deadlines, 'zset')

local now_ms = math.floor(now_us() / 1000)
for i = 1, count do
  local binding = ARGV[3 * i - 1]
  redis.call('HSET', bindings, binding, ARGV[3 * i])
  if lifetimes[i] > 0 then
    redis.call('ZADD', deadlines, now_ms + lifetimes[i], binding)
  else
    redis.call('ZREM', deadlines, binding)
  end
end
return count
