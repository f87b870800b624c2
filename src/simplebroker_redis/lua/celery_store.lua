-- celery_store.lua: store one entry of the Celery result backend (a task's
-- result, a group's) and wake the waiters of a task's result, in one step;
-- optionally also acknowledge (delete) the reserved message of the task
-- whose result it is, so that a stored result and its acknowledgement are
-- one change (a worker that dies between the two cannot run it again).
-- With the guard on, a task that already succeeded keeps its result: the
-- check Celery's key-value backends make with a separate read (a task that
-- ran twice must not overwrite SUCCESS), made atomic here. With an
-- acknowledgement it can also reserve the worker's next messages (as
-- reserve_queues.lua), so that a worker running one task at a time spends
-- one round trip per task, not one more per prefetch window.
-- uses: guard, members, celery, tokens, settling, reserving, ordered
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the entry (string).
-- ARGV: 1 wake prefix, 2 value, 3 expiry in ms ('' = none), 4 queue whose
--       wake channel to publish on ('' = none), 5 guard ('1' = keep an
--       entry whose JSON says "status": "SUCCESS"), 6 reservation token
--       ('' = acknowledge nothing), 7 the 19-digit ID to delete from it,
--       then optionally (with an acknowledgement) the reservation's 8 token
--       prefix, 9 limit, 10 lease in us ('-1' = never expires), 11 max
--       deliveries ('0' = unlimited), and (queue, dead-letter queue or '')
--       pairs, as ARGV 2.. of reserve_queues.lua.
-- Returns: {stored, settled, lost}: stored is 1 stored, 0 kept (the task
-- had succeeded; its message is acknowledged all the same), -1 nothing
-- done at all: the guard could not read the stored entry (not JSON:
-- another serializer), so the caller checks it itself; settled/lost as in
-- settle.lua (an unknown token or a damaged record: lost). With a
-- reservation asked for, then what reserve_queues.lua returns (none when
-- stored is -1).
-- Raises (before any write but upkeep's, which a reservation starts with,
-- as in reserve_queues.lua): ARG (a malformed expiry, key list or
-- reservation), WRONGTYPE, TOKEN.
celery_key_count(1)
local entry = KEYS[FIXED_KEYS + 1]
local value, px, queue, guard, token = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6] or ''
if px ~= '' and not string.find(px, '^[1-9]%d*$') then fail('ARG', 'expiry ' .. tostring(px)) end
local ahead, limit, lease = #ARGV > 7, tonumber(ARGV[9]), tonumber(ARGV[10])
if ahead and (token == '' or not limit or limit < 1 or not lease or (#ARGV - 11) % 2 ~= 0
    or #ARGV < 13) then
  fail('ARG', 'a reservation needs an acknowledgement, a limit, a lease and queue pairs')
end
-- The guard's read of the entry also refuses a wrong-typed entry (then
-- check_kind names it); without the guard, one TYPE does.
local current = false
if guard == '1' then
  current = redis.pcall('GET', entry)
  if type(current) == 'table' then
    check_kind(entry, 'string')
    error(current)
  end
else
  check_kind(entry, 'string')
end
-- A reservation starts with upkeep, before any plan below reads what it may change.
local head = nil
if ahead then head = open_reservation(lease) end
local stored = 1
if guard == '1' then
  if current then
    local readable, meta = pcall(cjson.decode, current)
    if not readable or type(meta) ~= 'table' then return {-1, 0, 0} end  -- reserves nothing
    if meta['status'] == 'SUCCESS' then stored = 0 end
  end
end

-- Plan the acknowledgement (reads and type checks) before the first write.
local plan, emptied, lost = nil, {}, 0
if token ~= '' then
  if ARGV[7] == nil then fail('ARG', 'acknowledgement of ' .. token .. ' without an ID') end
  lost = 1
  local readable, record = pcall(read_record, token)
  if readable and record then
    plan = settle_plan(token, record, 'delete', '', {ARGV[7]})
    emptied = settle_prepare({plan})
  end
end

local picked = nil
if ahead then
  local names, deads = queue_pairs(12)
  picked = plan_ordered(ARGV[8], limit, names, deads)
end

if stored == 1 then
  if px == '' then
    redis.call('SET', entry, value)
  else
    redis.call('SET', entry, value, 'PX', px)
  end
  if queue ~= '' then wake(queue) end
end
local settled = 0
if plan then settled, lost = settle_apply(plan) end
unregister_queues(emptied)
local out = {stored, settled, lost}
if picked then
  for _, part in ipairs(head) do out[#out + 1] = part end
  apply_ordered(picked, head[1], head[2], ARGV[10], ARGV[11], out)
end
return out
