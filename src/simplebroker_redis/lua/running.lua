-- running.lua: the messages in flight in every queue (the dashboard's
-- "running now"): each reserved message with its reservation (token, when
-- it was reserved, its lease deadline), delivery count and body. Read only.
-- uses: members, bulk
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 most messages returned, 3 longest body returned
--       (bytes; longer ones are cut).
-- Returns: {server time µs, reserved messages in all (those not returned
-- included), {queue, id, token, reserved at µs, lease deadline µs ('' none),
-- deliveries, body, body length, ...}} in queue, then ID, order.
local limit, cut = tonumber(ARGV[2]), tonumber(ARGV[3])
local members = redis.call('ZRANGE', K_RESERVED, '-', '+', 'BYLEX', 'LIMIT', 0, limit)
local ids = ids_of(members)
local tokens = hmget_all(K_OWNERS, ids)
local bodies = hmget_all(K_BODIES, ids)
local counts = hmget_all(K_DELIVERIES, ids)
local records, deadlines = {}, {}
for _, token in ipairs(tokens) do
  if token and not records[token] then
    local ok, record = pcall(cjson.decode, redis.call('HGET', K_TOKENS, token) or '')
    records[token] = (ok and type(record) == 'table') and record or {}
    deadlines[token] = redis.call('ZSCORE', K_LEASES, token) or ''
  end
end
local out = {}
for i, member in ipairs(members) do
  local token = tokens[i] or ''
  local record = records[token] or {}
  local body = bodies[i] or ''
  out[#out + 1] = mqueue(member)
  out[#out + 1] = ids[i]
  out[#out + 1] = token
  out[#out + 1] = string.format('%.0f', tonumber(record.c) or 0)
  out[#out + 1] = deadlines[token] or ''
  out[#out + 1] = counts[i] or '0'
  out[#out + 1] = string.sub(body, 1, cut)
  out[#out + 1] = #body
end
local t = redis.call('TIME')
return {t[1] .. string.format('%06d', tonumber(t[2])), redis.call('ZCARD', K_RESERVED), out}
