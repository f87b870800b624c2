-- dead_letter_requeue.lua: send dead letters back to work: pending messages
-- of a dead-letter queue move to a target queue, pending there with the same
-- IDs and a fresh delivery count (else the next failure would dead-letter
-- them again at once), all or nothing.
-- uses: guard, members, bulk
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 dead-letter queue, 3 target queue, 4.. 19-digit
--       message ids, or the single argument '*' for every pending message.
-- Returns: number of messages moved (ids not pending in the dead-letter
--          queue are skipped).
-- Raises (before any write): ARG when the target is the dead-letter queue.
local source, target = ARGV[2], ARGV[3]
if source == target then fail('ARG', 'requeue target is the dead-letter queue itself') end
local members
if ARGV[4] == '*' then
  members = redis.call('ZRANGE', K_PENDING, qlo(source), qhi(source), 'BYLEX')
else
  local wanted = {}
  for i = 4, #ARGV do wanted[#wanted + 1] = mem(source, ARGV[i]) end
  local scores = zmscore_all(K_PENDING, wanted)
  members = {}
  for i, member in ipairs(wanted) do
    if scores[i] then members[#members + 1] = member end
  end
end
check_keys({K_QUEUES, K_PENDING, K_DELIVERIES})
if #members == 0 then return 0 end
local ids = ids_of(members)
local moved = {}
for i, id in ipairs(ids) do moved[i] = mem(target, id) end
zadd_all(K_PENDING, moved)
zrem_all(K_PENDING, members)
hdel_all(K_DELIVERIES, ids)
register(target)
unregister_if_empty(source)
wake(target)
return #members
