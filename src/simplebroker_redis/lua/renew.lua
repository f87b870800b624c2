-- renew.lua: extend the leases of many tokens in one step.
-- uses: guard, reservations, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 lease in us ('' = each token's own lease length),
--       3.. tokens.
-- Returns: the tokens that no longer exist (settled, released or recovered).
-- Raises (before any write): CORRUPT when any token's record is damaged.
check_ns({K_TOKENS, K_LEASES})
-- Read (and so validate) every record before the first write: a damaged
-- token must not leave the ones before it renewed and the rest not.
local records = {}
for i = 3, #ARGV do records[i] = read_record(ARGV[i]) end
local now = now_us()
local lost = {}
for i = 3, #ARGV do
  local token, record = ARGV[i], records[i]
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
