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
-- uses: guard, members, tokens, settling, dramatiq
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the result (string), optionally 2 the result of a message ID
--       (string: the message key).
-- ARGV: 1 wake prefix, 2 value, 3 expiry in ms ('0' = none), 4 queue whose
--       wake channel to publish on ('' = none), 5 reservation token ('' =
--       acknowledge nothing), 6 the 19-digit ID to delete from it ('' with
--       no token), 7 the message key (with key 2).
-- Returns: {stored (1 or 0: fenced), settled, lost} (settled and lost as in
-- settle.lua; both 0 without a token).
-- Raises (before any write): ARG (a malformed expiry or key list), WRONGTYPE.
if #KEYS ~= FIXED_KEYS + 2 then dramatiq_key_count(1) end
local pointer = KEYS[FIXED_KEYS + 2]
if pointer and (not ARGV[7] or ARGV[7] == '') then
  fail('ARG', 'a result of a message ID needs its message key')
end
local entry = KEYS[FIXED_KEYS + 1]
local value, queue, token = ARGV[2], ARGV[4], ARGV[5]
local px = dramatiq_count(ARGV[3], 'expiry')
dramatiq_check_kind(entry, 'string')
if pointer then dramatiq_check_kind(pointer, 'string') end
local plan, emptied = nil, {}
if token ~= '' then
  if not ARGV[6] then fail('ARG', 'an acknowledgement needs an ID') end
  local record = read_record(token)
  if not record then return {0, 0, 1} end
  plan = settle_plan(token, record, 'delete', '', {ARGV[6]})
  if #plan.done == 0 then return {0, 0, plan.lost} end
  emptied = settle_prepare({plan})
end

if px > 0 then
  redis.call('SET', entry, value, 'PX', px)
  if pointer then redis.call('SET', pointer, ARGV[7], 'PX', px) end
else
  redis.call('SET', entry, value)
  if pointer then redis.call('SET', pointer, ARGV[7]) end
end
if queue ~= '' then wake(queue) end
local settled, lost = 0, 0
if plan then
  settled, lost = settle_apply(plan)
  unregister_queues(emptied)
end
return {1, settled, lost}
