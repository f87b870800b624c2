-- renew.lua: extend the leases of many tokens in one step.
-- KEYS: fixed keys (see _lib.lua).
-- ARGV: 1 wake prefix, 2 lease in us ('' = each token's own lease length),
--       3.. tokens.
-- Returns: the tokens that no longer exist (settled, released or recovered).
check_ns({K_TOKENS, K_LEASES})
local now = now_us()
local lost = {}
for i = 3, #ARGV do
  local token = ARGV[i]
  local record = read_record(token)
  if not record then
    lost[#lost + 1] = token
  else
    local lease = tonumber(record.l)
    if ARGV[2] ~= '' then lease = tonumber(ARGV[2]) end
    if lease >= 0 then
      record.d = string.format('%.0f', now + lease)
      record.l = string.format('%.0f', lease)
      redis.call('HSET', K_TOKENS, token, cjson.encode(record))
      redis.call('ZADD', K_LEASES, record.d, token)
    end
  end
end
return lost
