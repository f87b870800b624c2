-- commit.lua: store task results and settle reservations in one step: the
-- group commit of a Taskiq worker (taskiq_simplebroker/commit.py).
-- uses: guard, reservations
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then one key
--       per result to store.
-- ARGV: 1 wake prefix, 2 number of results R, then R pairs (value, expiry
--       in ms or '' to keep), then settlements: token, mode ('claim',
--       'delete' or 'move'), target ('' = the token's recorded target),
--       number of IDs N, then N 19-digit IDs.
-- Returns: {settled, lost} of each settlement in argument order, flattened;
-- an unknown token, or one whose record is damaged, settles nothing and
-- reports its IDs lost.
-- Raises (before any write): UNINITIALIZED/FOREIGN/SCHEMA/WRONGTYPE, ARG (a
-- malformed list, or a move without a target).
check_ns({K_QUEUES, K_PENDING, K_RESERVED, K_CLAIMED, K_BODIES, K_DELIVERIES,
  K_OWNERS, K_TOKENS, K_TOKEN_IDS, K_LEASES})
local results = tonumber(ARGV[2])
if not results or results < 0 or #KEYS - results ~= FIXED_KEYS then fail('ARG', 'result count') end

-- Validate the expiries and every settlement before the first write.
for i = 0, results - 1 do
  local px = ARGV[4 + 2 * i]
  if px == nil or (px ~= '' and not string.find(px, '^[1-9]%d*$')) then fail('ARG', 'expiry ' .. tostring(px)) end
end
local groups = {}
local at = 3 + 2 * results
while at <= #ARGV do
  local token, mode, target, n = ARGV[at], ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3])
  if not n or n < 0 or at + 3 + n > #ARGV then fail('ARG', 'settlement of ' .. token) end
  check_mode(mode)
  -- A damaged reservation record must not hold back the other tasks of the
  -- batch: its IDs are reported lost, and recovery deals with the token.
  local readable, record = pcall(read_record, token)
  if not readable then record = nil end
  if record then target = settle_target(record, mode, target) end
  local ids = {}
  for i = 1, n do ids[i] = ARGV[at + 3 + i] end
  groups[#groups + 1] = {token = token, mode = mode, target = target, record = record, ids = ids}
  at = at + 4 + n
end

for i = 0, results - 1 do
  local value, px = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  if px == '' then
    redis.call('SET', KEYS[FIXED_KEYS + 1 + i], value)
  else
    redis.call('SET', KEYS[FIXED_KEYS + 1 + i], value, 'PX', px)
  end
end

local out = {}
for _, group in ipairs(groups) do
  local settled, lost = 0, #group.ids
  if group.record then
    settled, lost = settle_ids(group.token, group.record, group.mode, group.target, group.ids)
  end
  out[#out + 1] = settled
  out[#out + 1] = lost
end
return out
