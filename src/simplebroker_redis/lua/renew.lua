-- renew.lua: extend the leases of many tokens in one step.
-- uses: guard, bulk, tokens, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 lease in us ('' = each token's own lease length),
--       3.. tokens.
-- Returns: {server time in us, then the tokens that no longer exist
-- (settled, released or recovered)}. The time lets a worker know each
-- renewed lease's deadline (time + lease) on the server's clock.
-- Raises (before any write): CORRUPT when any token's record is damaged.
-- Read (and so validate) every record before the first write: a damaged
-- token must not leave the ones before it renewed and the rest not.
local tokens = {}
for i = 3, #ARGV do tokens[#tokens + 1] = ARGV[i] end
local raw = hmget_all(K_TOKENS, tokens)
local records = {}
for i, token in ipairs(tokens) do
  if raw[i] then records[i] = decode_record(token, raw[i]) end
end
check_keys({K_LEASES})
local now = now_us()
local lost, encoded, scores = {string.format('%.0f', now)}, {}, {}
for i, token in ipairs(tokens) do
  local record = records[i]
  if not record then
    lost[#lost + 1] = token
  else
    local lease = tonumber(record.l)
    if ARGV[2] ~= '' then lease = tonumber(ARGV[2]) end
    if lease >= 0 then
      record.d = string.format('%.0f', now + lease)
      record.l = string.format('%.0f', lease)
      encoded[#encoded + 1] = token
      encoded[#encoded + 1] = cjson.encode(record)
      scores[#scores + 1] = record.d
      scores[#scores + 1] = token
    end
  end
end
hset_all(K_TOKENS, encoded)
for i = 1, #scores, 2 * CHUNK do
  redis.call('ZADD', K_LEASES, unpack(scores, i, math.min(i + 2 * CHUNK - 1, #scores)))
end
return lost
