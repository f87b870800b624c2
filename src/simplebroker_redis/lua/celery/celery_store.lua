-- celery_store.lua: store one entry of the Celery result backend (a task's
-- result, a group's) and wake the waiters of a task's result, in one step;
-- optionally also acknowledge (delete) the reserved message of the task
-- whose result it is, so that a stored result and its acknowledgement are
-- one change (a worker that dies between the two cannot run it again).
-- With the guard on, a task that already succeeded keeps its result: the
-- check Celery's key-value backends make with a separate read (a task that
-- ran twice must not overwrite SUCCESS), made atomic here. A result can be
-- fenced by the reservation its task ran under: when that token no longer
-- holds the message (its lease expired and another worker took it over, or
-- it was handed back), nothing is stored: the result of a stale worker
-- never overwrites the current holder's. A result stored under the fence
-- alone ('fence': a prefork pool process, whose acknowledgement follows
-- from the worker's main process) renews the reservation's lease: the task
-- ran to its end under it, so no recovery pass may take the message back
-- between the two (a store that a partition held past the lease landed,
-- then the message was recovered and ran again: issue 42). With an
-- acknowledgement it can also reserve the worker's next messages (as
-- reserve_queues.lua), so that a worker running one task at a time spends
-- one round trip per task, not one more per prefetch window.
-- uses: guard, members, celery, tokens, settling, reserving, ordered, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the entry (string).
-- ARGV: 1 wake prefix, 2 value, 3 expiry in ms ('' = none), 4 queue whose
--       wake channel to publish on ('' = none), 5 guard ('1' = keep an
--       entry whose JSON says "status": "SUCCESS"), 6 holding: '' (not
--       fenced), 'fence' (store only while ARGV 7 holds ARGV 8) or 'ack'
--       (the same, and delete that message), 7 reservation token, 8 the
--       19-digit message ID, then optionally (with 'ack') the reservation's
--       9 token prefix ('<holder>.<random>': the upkeep spares that
--       holder's tokens), 10 limit, 11 lease in us ('-1' = never expires), 12
--       max deliveries ('0' = unlimited), and (queue, dead-letter queue or
--       '') pairs, as ARGV 2.. of reserve_queues.lua.
-- Returns: {stored, settled, lost}: stored is 1 stored, 0 kept (the task
-- had succeeded; its message is acknowledged all the same), -1 nothing
-- done at all: the guard could not read the stored entry (not JSON:
-- another serializer), so the caller checks it itself; -2 nothing done:
-- fenced, the token no longer holds the message (lost is 1; stored 0
-- instead when the entry already holds this very value: a retry of a store
-- that happened); settled/lost as in settle.lua. With a reservation asked for, then what
-- reserve_queues.lua returns (none when stored is negative).
-- Raises (before any write but upkeep's, which a reservation starts with,
-- as in reserve_queues.lua): ARG (a malformed expiry, holding, key list or
-- reservation), WRONGTYPE, CORRUPT (the fencing token's record), TOKEN.
celery_key_count(1)
local entry = KEYS[FIXED_KEYS + 1]
local value, px, queue, guard = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local holding, token, message = ARGV[6] or '', ARGV[7] or '', ARGV[8]
if px ~= '' and not string.find(px, '^[1-9]%d*$') then fail('ARG', 'expiry ' .. tostring(px)) end
if holding ~= '' and holding ~= 'fence' and holding ~= 'ack' then
  fail('ARG', 'holding ' .. tostring(holding))
end
if holding ~= '' and (token == '' or not message) then
  fail('ARG', holding .. ' needs a token and a message ID')
end
local ahead, limit, lease = #ARGV > 8, tonumber(ARGV[10]), tonumber(ARGV[11])
if ahead and (holding ~= 'ack' or not limit or limit < 1 or not lease or (#ARGV - 12) % 2 ~= 0
    or #ARGV < 14) then
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
-- The fence: the token must still hold the message (reads only).
local record = nil
if holding ~= '' then
  check_keys({K_TOKENS, K_LEASES})
  record = read_record(token)
  if not record or #held_ids(token, record.q, {message}) == 0 then
    -- The same value stored already: this call's own first try, whose reply was lost.
    if current == value then return {0, 0, 1} end
    return {-2, 0, 1}
  end
end
-- A reservation starts with upkeep, before any plan below reads what it may change.
local head = nil
if ahead then head = open_reservation(lease, ARGV[9]) end
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
if holding == 'ack' then
  plan = settle_plan(token, record, 'delete', '', {message})
  emptied = settle_prepare({plan})
end

local picked = nil
if ahead then
  local names, deads = queue_pairs(13)
  picked = plan_ordered(ARGV[9], limit, names, deads)
end
if stored == 1 then
  if px == '' then
    redis.call('SET', entry, value)
  else
    redis.call('SET', entry, value, 'PX', px)
  end
  if queue ~= '' then wake(queue) end
end
if holding == 'fence' then
  local lease = tonumber(record.l)
  if lease >= 0 then
    record.d = string.format('%.0f', now_us() + lease)
    redis.call('HSET', K_TOKENS, token, cjson.encode(record))
    redis.call('ZADD', K_LEASES, record.d, token)
  end
end
local settled = 0
if plan then settled, lost = settle_apply(plan) end
unregister_queues(emptied)
local out = {stored, settled, lost}
if picked then
  for _, part in ipairs(head) do out[#out + 1] = part end
  apply_ordered(picked, head[1], head[2], ARGV[11], ARGV[12], out)
end
return out
