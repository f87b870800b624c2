-- bind.lua: record exchange bindings that every process of the namespace
-- sees, and (re)start the lifetime of those whose queue expires when unused
-- (Celery's pidbox and reply queues). A consumer's heartbeat runs it again
-- for the queues it consumes, so their bindings live while it does.
-- KEYS: 1 bindings (hash: "<exchange> US <routing key> US <queue>" -> JSON),
--       2 binding deadlines (zset: binding -> expiry, server milliseconds).
-- ARGV: triples: binding, JSON value, lifetime in ms ('0' = never expires).
-- Returns: the number of bindings written.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local written = 0
for i = 1, #ARGV, 3 do
  local binding, lifetime = ARGV[i], tonumber(ARGV[i + 2])
  redis.call('HSET', KEYS[1], binding, ARGV[i + 1])
  if lifetime > 0 then
    redis.call('ZADD', KEYS[2], now_ms + lifetime, binding)
  else
    redis.call('ZREM', KEYS[2], binding)
  end
  written = written + 1
end
return written
