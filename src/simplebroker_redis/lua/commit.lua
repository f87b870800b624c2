-- commit.lua: store task results and settle reservations in one step: the
-- group commit of a Taskiq worker (taskiq_simplebroker/commit.py). A
-- result may be fenced by the message whose task produced it: it is stored
-- only while that reservation still holds the message, so a worker whose
-- lease was taken over (it was stopped, or cut off, past its lease) cannot
-- overwrite the result of the worker that holds the message now.
-- uses: guard, bulk, tokens, settling
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then one key
--       per result to store.
-- ARGV: 1 wake prefix, 2 number of results R, then R quadruples (value,
--       expiry in ms or '' to keep, fencing token or '' for none, the
--       fencing message's 19-digit ID or ''), then settlements: token, mode
--       ('claim', 'delete' or 'move'), target ('' = the token's recorded
--       target), number of IDs N, then N 19-digit IDs.
-- Returns: {results refused (fenced: the token no longer holds the
-- message), then {settled, lost} of each settlement in argument order,
-- flattened}; an unknown token, or one whose record is damaged, settles
-- nothing and reports its IDs lost.
-- Raises (before any write): WRONGTYPE, ARG (a malformed list, or a move
-- without a target).
local results = tonumber(ARGV[2])
if not results or results < 0 or #KEYS - results ~= FIXED_KEYS then fail('ARG', 'result count') end

-- Validate the expiries and every settlement, check every fence and plan
-- every settlement (reads only), before the first write.
local fenced, fences = {}, {}
for i = 0, results - 1 do
  local px, token, id = ARGV[4 + 4 * i], ARGV[5 + 4 * i], ARGV[6 + 4 * i]
  if px == nil or (px ~= '' and not string.find(px, '^[1-9]%d*$')) then fail('ARG', 'expiry ' .. tostring(px)) end
  if id == nil or (token ~= '' and not string.find(id, '^%d+$')) then fail('ARG', 'fence of result ' .. i) end
  if token ~= '' then
    fenced[#fenced + 1] = i
    fences[#fences + 1] = id
  end
end
local refused = {}
if #fences > 0 then
  local owners = hmget_all(K_OWNERS, fences)
  for n, i in ipairs(fenced) do
    if owners[n] ~= ARGV[5 + 4 * i] then refused[i] = true end
  end
end
local groups, plans = {}, {}
local at = 3 + 4 * results
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

local out = {0}
for i = 0, results - 1 do
  local value, px = ARGV[3 + 4 * i], ARGV[4 + 4 * i]
  if refused[i] then
    out[1] = out[1] + 1
  elseif px == '' then
    redis.call('SET', KEYS[FIXED_KEYS + 1 + i], value)
  else
    redis.call('SET', KEYS[FIXED_KEYS + 1 + i], value, 'PX', px)
  end
end

for _, group in ipairs(groups) do
  local settled, lost = 0, group.lost
  if group.plan then settled, lost = settle_apply(group.plan) end
  out[#out + 1] = settled
  out[#out + 1] = lost
end
unregister_queues(emptied)
return out
