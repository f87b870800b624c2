-- dramatiq_store.lua: store one Dramatiq result and wake its waiters, in one
-- step; optionally also acknowledge (delete) the reserved message whose
-- result it is, so that a stored result and its acknowledgement are one
-- change (a worker that dies between the two cannot run the task again with
-- its result already stored, nor leave a result without its ack). With an
-- acknowledgement the result is fenced: when the token no longer holds the
-- message (its lease expired and another worker took it over), nothing is
-- stored, and the current holder's result stands.
-- With a second key it also stores, with the same expiry, which result
-- belongs to a Dramatiq message ID (the dashboard finds a finished task by
-- its message ID through it: only Dramatiq's message key, an MD5, names the
-- result).
-- With an acknowledgement it can also reserve the consumer's next messages
-- (as reserve_queues.lua), fenced or not, so that a consumer whose queue was
-- woken while it ran a task spends the acknowledgement's round trip on its
-- next reservation instead of one more (the reservation's upkeep runs first,
-- before the fence is read).
-- uses: guard, members, tokens, settling, reserving, ordered, dramatiq
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the result (string), optionally 2 the result of a message ID
--       (string: the message key).
-- ARGV: 1 wake prefix, 2 value, 3 expiry in ms ('0' = none), 4 queue whose
--       wake channel to publish on ('' = none), 5 reservation token ('' =
--       acknowledge nothing), 6 the 19-digit ID to delete from it ('' with
--       no token), 7 the message key (with key 2; else '' when a
--       reservation follows), then optionally (with a token) the
--       reservation's 8 token prefix, 9 limit, 10 lease in us ('-1' = never
--       expires), 11 max deliveries ('0' = unlimited), and (queue,
--       dead-letter queue or '') pairs, as ARGV 2.. of reserve_queues.lua.
-- Returns: {stored (1 or 0: fenced), settled, lost} (settled and lost as in
-- settle.lua; both 0 without a token), then, with a reservation, what
-- reserve_queues.lua returns.
-- Raises (before any write but upkeep's, which a reservation starts with,
-- as in reserve_queues.lua): ARG (a malformed expiry, key list or
-- reservation), WRONGTYPE, CORRUPT (the token's record), TOKEN.
if #KEYS ~= FIXED_KEYS + 2 then dramatiq_key_count(1) end
local pointer = KEYS[FIXED_KEYS + 2]
if pointer and (not ARGV[7] or ARGV[7] == '') then
  fail('ARG', 'a result of a message ID needs its message key')
end
local entry = KEYS[FIXED_KEYS + 1]
local value, queue, token = ARGV[2], ARGV[4], ARGV[5]
local px = dramatiq_count(ARGV[3], 'expiry')
local ahead, limit, lease = #ARGV > 7, tonumber(ARGV[9]), tonumber(ARGV[10])
if ahead and (token == '' or not limit or limit < 1 or not lease or (#ARGV - 11) % 2 ~= 0
    or #ARGV < 13) then
  fail('ARG', 'a reservation needs an acknowledgement, a limit, a lease and queue pairs')
end
dramatiq_check_kind(entry, 'string')
if pointer then dramatiq_check_kind(pointer, 'string') end
if token ~= '' and not ARGV[6] then fail('ARG', 'an acknowledgement needs an ID') end
-- A reservation starts with upkeep, before the fence and the plans below read
-- what it may change.
local head = nil
if ahead then head = open_reservation(lease, ARGV[8]) end
local plan, emptied, fenced, lost = nil, {}, false, 0
if token ~= '' then
  local record = read_record(token)
  if not record then
    fenced, lost = true, 1
  else
    plan = settle_plan(token, record, 'delete', '', {ARGV[6]})
    if #plan.done == 0 then
      fenced, lost, plan = true, plan.lost, nil
    else
      emptied = settle_prepare({plan})
    end
  end
end
local picked = nil
if ahead then
  local names, deads = queue_pairs(12)
  picked = plan_ordered(ARGV[8], limit, names, deads)
end

local out = {0, 0, lost}
if not fenced then
  if px > 0 then
    redis.call('SET', entry, value, 'PX', px)
    if pointer then redis.call('SET', pointer, ARGV[7], 'PX', px) end
  else
    redis.call('SET', entry, value)
    if pointer then redis.call('SET', pointer, ARGV[7]) end
  end
  if queue ~= '' then wake(queue) end
  out[1] = 1
  if plan then
    out[2], out[3] = settle_apply(plan)
    unregister_queues(emptied)
  end
end
if picked then
  for _, part in ipairs(head) do out[#out + 1] = part end
  apply_ordered(picked, head[1], head[2], ARGV[10], ARGV[11], out)
end
return out
