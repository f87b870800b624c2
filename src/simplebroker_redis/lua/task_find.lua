-- task_find.lua: where some tasks are now, for the dashboard's search by id:
-- the messages the task index names (lib/tasks.lua) and messages named by
-- (queue, id), each with its state, and the values of result keys. Read
-- only. Each lookup is a few hash and sorted-set reads: no scan.
-- uses: members
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then result
--       keys to read (strings, any number, inside the namespace's hash tag).
-- ARGV: 1 wake prefix, 2 longest body returned (bytes; longer ones are cut),
--       3 n, then n task index keys, then m, then m (queue, 19-digit id)
--       pairs, then the other queues to look in for a message no longer in
--       the queue it was written to (dead-letter queues, say).
-- Returns: {server time µs, {found}, {value of each result key ('' none)}},
-- found being, per message located, {what ('k:<key>' or 'm:<queue>'), id,
-- queue written to, state, queue now, deliveries, due µs (delayed) or lease
-- deadline µs (reserved) or '', token or '', reserved at µs or '', body, body
-- length}. State: pending, delayed, reserved, claimed; 'moved' for a
-- message stored in none of the queues looked in, 'gone' for an index entry
-- whose message is gone (never, while the index is intact). Index keys
-- without an entry are left out.
local cut = tonumber(ARGV[2])
local wanted = {}
local at = 4
local n = tonumber(ARGV[3])
if n > 0 then
  local fields = {}
  for i = 1, n do fields[i] = 'k:' .. ARGV[at + i - 1] end
  local got = redis.call('HMGET', K_TASKS, unpack(fields))
  for i = 1, n do
    local id, queue = string.match(got[i] or '', '^(%d+) (.+)$')
    if id then wanted[#wanted + 1] = {fields[i], id, queue} end
  end
end
at = at + n
local m = tonumber(ARGV[at])
for i = 1, m do
  local j = at + 2 * i - 1
  wanted[#wanted + 1] = {'m:' .. ARGV[j], ARGV[j + 1], ARGV[j]}
end
local elsewhere = {}
for i = at + 2 * m + 1, #ARGV do elsewhere[#elsewhere + 1] = ARGV[i] end

-- The reservation holding `id`: queue, lease deadline, token, reserved at.
local function held(id)
  local token = redis.call('HGET', K_OWNERS, id)
  if not token then return nil end
  local ok, record = pcall(cjson.decode, redis.call('HGET', K_TOKENS, token) or '')
  if not ok or type(record) ~= 'table' then return {'', '', token, ''} end
  local deadline = redis.call('ZSCORE', K_LEASES, token) or ''
  return {tostring(record.q or ''), deadline, token, string.format('%.0f', tonumber(record.c) or 0)}
end

-- The state of `id` in the first of `queues` that holds it: state, queue, due.
local function placed(id, queues)
  for _, queue in ipairs(queues) do
    local member = mem(queue, id)
    if redis.call('ZSCORE', K_PENDING, member) then return {'pending', queue, ''} end
    local due = redis.call('ZSCORE', K_DUE, member)
    if due and redis.call('ZSCORE', K_DELAYED, member) then return {'delayed', queue, due} end
    if redis.call('ZSCORE', K_CLAIMED, member) then return {'claimed', queue, ''} end
  end
  return nil
end

local found = {}
for _, item in ipairs(wanted) do
  local what, id, written = item[1], item[2], item[3]
  local body = redis.call('HGET', K_BODIES, id)
  local state, queue, until_us, token, since = 'gone', '', '', '', ''
  if body then
    local holder = held(id)
    if holder then
      state, queue, until_us, token, since = 'reserved', holder[1], holder[2], holder[3], holder[4]
    else
      local queues = {written}
      for _, other in ipairs(elsewhere) do queues[#queues + 1] = other end
      local where = placed(id, queues)
      if where then
        state, queue, until_us = where[1], where[2], where[3]
      else
        state = 'moved'
      end
    end
  end
  local deliveries = redis.call('HGET', K_DELIVERIES, id) or '0'
  body = body or ''
  found[#found + 1] = {what, id, written, state, queue, deliveries, until_us, token, since,
    string.sub(body, 1, cut), #body}
end

local results = {}
for i = FIXED_KEYS + 1, #KEYS do
  local value = redis.pcall('GET', KEYS[i])
  if type(value) == 'string' then results[#results + 1] = string.sub(value, 1, cut)
  else results[#results + 1] = '' end
end
local t = redis.call('TIME')
return {t[1] .. string.format('%06d', tonumber(t[2])), found, results}
