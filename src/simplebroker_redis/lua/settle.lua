-- settle.lua: finish reserved messages of a token: 'claim' marks them
-- consumed (claimed, kept until vacuum), 'delete' removes them, 'move' makes
-- them pending in a target queue (same IDs). The token disappears once it
-- holds no more IDs.
-- KEYS: fixed keys (see _lib.lua).
-- ARGV: 1 wake prefix, 2 token, 3 mode ('claim'|'delete'|'move'), 4 target
--       ('' = the target recorded at reserve time), 5.. 19-digit ids, or a
--       single '*' for every ID the token still holds.
-- Returns: {settled, lost}: `lost` counts requested IDs the token no longer
-- holds (recovered after lease expiry, or never reserved by it). An unknown
-- token settles nothing and reports every requested ID (or -1 for '*') lost.
check_ns({K_QUEUES, K_PENDING, K_RESERVED, K_CLAIMED, K_BODIES, K_DELIVERIES,
  K_OWNERS, K_TOKENS, K_TOKEN_IDS, K_LEASES})
local token, mode = ARGV[2], ARGV[3]
local record = read_record(token)
if not record then
  if ARGV[5] == '*' then return {0, -1} end
  return {0, #ARGV - 4}
end
local queue = record.q
local target = ARGV[4]
if target == '' then target = record.t end
if mode == 'move' and (target == '' or target == queue) then fail('ARG', 'move needs a target queue') end

local ids = {}
if ARGV[5] == '*' then
  ids = ids_of(token_members(token))
else
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local done, drop, lost = {}, {}, 0
for _, id in ipairs(ids) do
  if redis.call('HGET', K_OWNERS, id) == token
    and redis.call('ZSCORE', K_RESERVED, mem(queue, id)) then
    done[#done + 1] = id
    drop[#drop + 1] = token .. ' ' .. id
  else
    lost = lost + 1
  end
end
local members = {}
for i, id in ipairs(done) do members[i] = mem(queue, id) end
zrem_all(K_RESERVED, members)
hdel_all(K_OWNERS, done)
zrem_all(K_TOKEN_IDS, drop)
if mode == 'claim' then
  zadd_all(K_CLAIMED, members)
elseif mode == 'delete' then
  hdel_all(K_BODIES, done)
  hdel_all(K_DELIVERIES, done)
  unregister_if_empty(queue)
else
  local moved = {}
  for i, id in ipairs(done) do moved[i] = mem(target, id) end
  zadd_all(K_PENDING, moved)
  if #moved > 0 then
    register(target)
    wake(target)
  end
  unregister_if_empty(queue)
end
if not redis.call('ZRANGE', K_TOKEN_IDS, '[' .. token .. ' ', '(' .. token .. '!',
    'BYLEX', 'LIMIT', 0, 1)[1] then
  drop_token(token)
end
return {#done, lost}
