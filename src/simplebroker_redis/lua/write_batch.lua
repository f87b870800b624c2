-- write_batch.lua: add several messages (any queues) in one step, all or
-- nothing: the group commit of concurrent asyncio writers (AsyncMessages).
-- A message may carry an idempotency key: one that a write stored within
-- the key's window is not stored again (the reply gives the first ID), so
-- a write sent again after its reply was lost never makes a second copy.
-- uses: guard, members, bulk, ids, time, counters, tasks
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then one
--       idempotency key (a string: sent:<key>) per message that has one, in
--       message order.
-- ARGV: 1 wake prefix, 2 candidate ID of the first new message (client
--       clock, 19 digits), then quintuples (queue, body, delay in us ('0' =
--       now), task index key ('' = none; see lib/tasks.lua), how long (ms)
--       the message's idempotency key is kept ('' for a message without one)).
-- Returns: the 19-digit IDs, in argument order: new ones consecutive above
-- the first (see allocate() in lib/ids.lua), a repeated key's the ID its
-- first write got (earlier, or in this batch).
-- Raises (before any write): UNINITIALIZED/FOREIGN/SCHEMA/WRONGTYPE, CLOCK,
-- IDCONFLICT, IDRANGE, ARG (malformed quintuples or key list). One wake-up
-- is published per queue written.
local count = (#ARGV - 2) / 5
if count < 1 or count ~= math.floor(count) then
  fail('ARG', 'expected (queue, body, delay, task key, key window) quintuples')
end
-- Idempotency keys first (reads): items already stored, or repeated in this
-- batch, are not written; `first[key]` is the item that writes a key, and
-- `slot[i]` the KEYS index of item i's key.
local keyed, ids, first, fresh, slot = FIXED_KEYS, {}, {}, {}, {}
for i = 1, count do
  local window = ARGV[5 * i + 2]
  if window ~= '' then
    if not string.find(window, '^[1-9]%d*$') then fail('ARG', 'idempotency window ' .. window) end
    keyed = keyed + 1
    if keyed > #KEYS then fail('ARG', 'fewer idempotency keys than keyed messages') end
    slot[i] = keyed
    if not first[KEYS[keyed]] then
      local earlier = redis.call('GET', KEYS[keyed])
      if earlier then ids[i] = earlier else first[KEYS[keyed]] = i end
    end
  end
  if not ids[i] and (not slot[i] or first[KEYS[slot[i]]] == i) then fresh[#fresh + 1] = i end
end
if keyed ~= #KEYS then fail('ARG', 'more idempotency keys than keyed messages') end
if #fresh == 0 then return ids end
-- Reads first (each also refuses a wrong-typed key): meta and the candidate
-- ID in bodies; the queues of the batch in the registry.
local allocated = allocate({ARGV[2]}, #fresh, high_water(namespace_meta('last_ts')))
local queues, order, delayed = {}, {}, false
for n, i in ipairs(fresh) do
  ids[i] = allocated[n]
  local queue = ARGV[5 * i - 2]
  if not queues[queue] then
    queues[queue] = true
    order[#order + 1] = queue
  end
  if tonumber(ARGV[5 * i]) > 0 then delayed = true end
end
for i = 1, count do
  if not ids[i] then ids[i] = ids[first[KEYS[slot[i]]]] end
end
local known = zmscore_all(K_QUEUES, order)
if delayed then check_keys({K_DELAYED, K_DUE}) end

local fields, pending, later = {}, {}, {}
for _, i in ipairs(fresh) do
  local at = 5 * i - 2
  local member = mem(ARGV[at], ids[i])
  fields[#fields + 1] = ids[i]
  fields[#fields + 1] = ARGV[at + 1]
  if tonumber(ARGV[at + 2]) > 0 then
    later[#later + 1] = i
  else
    pending[#pending + 1] = member
  end
end
-- The first write: a wrong-typed pending set fails here, before anything changed.
zadd_all(K_PENDING, pending)
if #later > 0 then
  local now = now_us()
  for _, i in ipairs(later) do
    local member = mem(ARGV[5 * i - 2], ids[i])
    redis.call('ZADD', K_DELAYED, 0, member)
    redis.call('ZADD', K_DUE, string.format('%.0f', now + tonumber(ARGV[5 * i])), member)
  end
end
hset_all(K_BODIES, fields)
local indexed = {}
for _, i in ipairs(fresh) do
  indexed[#indexed + 1] = {ARGV[5 * i + 1], ids[i], ARGV[5 * i - 2]}
  if slot[i] then redis.call('SET', KEYS[slot[i]], ids[i], 'PX', ARGV[5 * i + 2]) end
end
index_tasks(indexed)
count_members(pending, 'enqueued')
for _, i in ipairs(later) do count_event(ARGV[5 * i - 2], 'enqueued', 1) end
for i, queue in ipairs(order) do
  if not known[i] then register(queue) end
end
redis.call('HSET', K_META, 'last_ts', allocated[#allocated])
for _, queue in ipairs(order) do wake(queue) end
return ids
