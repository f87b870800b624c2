-- commit.lua: store task results and settle reservations in one step: the
-- group commit of a Taskiq worker (taskiq_simplebroker/commit.py).
-- uses: guard, tokens, settling
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then one key
--       per result to store.
-- ARGV: 1 wake prefix, 2 number of results R, then R pairs (value, expiry
--       in ms or '' to keep), then settlements: token, mode ('claim',
--       'delete' or 'move'), target ('' = the token's recorded target),
--       number of IDs N, then N 19-digit IDs.
-- Returns: {settled, lost} of each settlement in argument order, flattened;
-- an unknown token, or one whose record is damaged, settles nothing and
-- reports its IDs lost.
-- Raises (before any write): WRONGTYPE, ARG (a
-- malformed list, or a move without a target).
local results = tonumber(ARGV[2])
if not results or results < 0 or #KEYS - results ~= FIXED_KEYS then fail('ARG', 'result count') end

-- Validate the expiries and every settlement, and plan every settlement
-- (reads only), before the first write.
for i = 0, results - 1 do
  local px = ARGV[4 + 2 * i]
  if px == nil or (px ~= '' and not string.find(px, '^[1-9]%d*$')) then fail('ARG', 'expiry ' .. tostring(px)) end
end
local groups, plans = {}, {}
local at = 3 + 2 * results
while at <= #ARGV do
  local token, mode, target, n = ARGV[at], ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3])
  if not n or n < 0 or at + 3 + n > #ARGV then fail('ARG', 'settlement of ' .. token) end
  check_mode(mode)
  local ids = {}
  for i = 1, n do ids[i] = ARGV[at + 3 + i] end
  -- A damaged reservation record must not hold back the other tasks of the
  -- batch: its IDs are reported lost, and recovery deals with the token.
  local readable, record = pcall(read_record, token)
  local group = {lost = n}
  if readable and record then
    group.plan = settle_plan(token, record, mode, settle_target(record, mode, target), ids)
    plans[#plans + 1] = group.plan
  end
  groups[#groups + 1] = group
  at = at + 4 + n
end
local emptied = settle_prepare(plans)

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
  local settled, lost = 0, group.lost
  if group.plan then settled, lost = settle_apply(group.plan) end
  out[#out + 1] = settled
  out[#out + 1] = lost
end
unregister_queues(emptied)
return out
