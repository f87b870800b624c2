-- celery_chord_dispatch.lua: commit a chord's dispatch in one step: write
-- the messages its body (or error callbacks) published, and mark the chord
-- done. The result backend stages those publishes instead of sending them
-- (celery_simplebroker/staging.py), so a worker that dies at any point
-- either sent the body and marked the chord done, or did neither: the part
-- holding the claim dispatches again when its task runs again.
-- uses: guard, members, bulk, ids, celery, counters
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the parts (set), 2 the dispatch claim (string), 3 the size
--       (hash), 4 the results (hash), as in celery_chord_part.lua; all but
--       the claim are deleted with the 'done' mark.
-- ARGV: 1 wake prefix, 2 the part that holds the claim, 3 lifetime of the
--       'done' mark in ms ('0' = none), 4 candidate ID of the first message
--       (client clock, 19 digits; '' when there is no message), then pairs
--       (queue, body).
-- Returns: {1, committed 19-digit IDs in argument order ...}, or {0} when
-- the claim is not this part's (the chord was done already): nothing written.
-- Raises (before any write): ARG, WRONGTYPE, UNINITIALIZED/FOREIGN/SCHEMA,
-- CLOCK, IDCONFLICT, IDRANGE. One wake-up is published per queue written.
celery_key_count(4)
local parts, claim_key = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
local size_key, results = KEYS[FIXED_KEYS + 3], KEYS[FIXED_KEYS + 4]
local part, lifetime, candidate = ARGV[2], lifetime_ms(ARGV[3]), ARGV[4]
if not part or part == '' then fail('ARG', 'expected a part') end
local count = (#ARGV - 4) / 2
if count < 0 or count ~= math.floor(count) then fail('ARG', 'expected (queue, body) pairs') end
if (count > 0) ~= (candidate ~= '') then fail('ARG', 'a candidate ID for the messages, and only then') end
check_kind(parts, 'set')
check_kind(size_key, 'hash')
check_kind(results, 'hash')
local claim = redis.call('GET', claim_key)
-- No claim at all: its lifetime ran out; sending beats losing the body.
if claim and claim ~= part then return {0} end

local ids, order, known = {}, {}, {}
if count > 0 then
  ids = allocate({candidate}, count, high_water(namespace_meta('last_ts')))
  local seen = {}
  for i = 1, count do
    local queue = ARGV[3 + 2 * i]
    if not seen[queue] then
      seen[queue] = true
      order[#order + 1] = queue
    end
  end
  known = zmscore_all(K_QUEUES, order)
end

local pending, fields = {}, {}
for i = 1, count do
  pending[i] = mem(ARGV[3 + 2 * i], ids[i])
  fields[#fields + 1] = ids[i]
  fields[#fields + 1] = ARGV[4 + 2 * i]
end
-- The first write: a wrong-typed pending set fails here, before anything changed.
zadd_all(K_PENDING, pending)
hset_all(K_BODIES, fields)
count_members(pending, 'enqueued')
for i, queue in ipairs(order) do
  if not known[i] then register(queue) end
end
if count > 0 then redis.call('HSET', K_META, 'last_ts', ids[count]) end
if lifetime > 0 then
  redis.call('SET', claim_key, 'done', 'PX', lifetime)
else
  redis.call('SET', claim_key, 'done')
end
redis.call('DEL', parts, size_key, results)
for _, queue in ipairs(order) do wake(queue) end
local reply = {1}
for i = 1, count do reply[i + 1] = ids[i] end
return reply
