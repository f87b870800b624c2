-- exchange_table.lua: the live bindings of one exchange. Bindings whose
-- lifetime ran out (their consumer is gone) are removed first, of every
-- exchange, at most 100 per call.
-- KEYS: 1 bindings (hash), 2 binding deadlines (zset), as in bind.lua.
-- ARGV: 1 exchange name.
-- Returns: {n, binding 1, value 1, ..., binding n, value n, removed binding ...}.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local removed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms, 'LIMIT', 0, 100)
for _, binding in ipairs(removed) do
  redis.call('HDEL', KEYS[1], binding)
  redis.call('ZREM', KEYS[2], binding)
end
local prefix = ARGV[1] .. '\031'
local reply = {0}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, #prefix) == prefix then
    reply[#reply + 1] = all[i]
    reply[#reply + 1] = all[i + 1]
  end
end
reply[1] = (#reply - 1) / 2
for _, binding in ipairs(removed) do reply[#reply + 1] = binding end
return reply
