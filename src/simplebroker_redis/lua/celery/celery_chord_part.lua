-- celery_chord_part.lua: record one finished header entry of a chord (its
-- result), once however often its task ran, and decide atomically which
-- call dispatches the chord's body (celery_simplebroker/chords.py).
-- uses: guard, celery
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the parts seen (set of "<task id>:<header index>"),
--       2 the dispatch claim (string: the part that dispatches, or 'done'),
--       3 the chord's size (hash: 'size' from celery_chord_size.lua,
--       'extra' from celery_chord_add.lua),
--       4 the parts' results (hash: part -> result).
-- ARGV: 1 wake prefix, 2 this part ("<task id>:<header index>"), 3 its
--       result (Celery's encoding), 4 the size to use when KEYS[3] holds
--       none ('0': unknown, then no call dispatches until it is set),
--       5 lifetime of the parts, results and size in ms ('0' = none).
-- Returns: {parts seen (-1 once the body was dispatched), 1 if this call
--   must dispatch the body else 0, then, for the call that must, every
--   (part, result) pair}. The part holding the claim gets 1 again when its
--   task runs again (its worker died before the dispatch was committed by
--   celery_chord_dispatch.lua). A part's first result is kept.
-- Raises (before any write): ARG (malformed arguments), WRONGTYPE.
-- Its commands are in docs/celery.md's ACL line (SADD, SCARD, HSET, ...).
celery_key_count(4)
local parts, claim_key = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
local size_key, results = KEYS[FIXED_KEYS + 3], KEYS[FIXED_KEYS + 4]
local part, value, fallback, lifetime = ARGV[2], ARGV[3], tonumber(ARGV[4]), lifetime_ms(ARGV[5])
if not part or part == '' then fail('ARG', 'expected a part') end
if not value then fail('ARG', 'expected a result') end
if not fallback or fallback < 0 or fallback ~= math.floor(fallback) then
  fail('ARG', 'chord size ' .. tostring(ARGV[4]))
end
check_kind(parts, 'set')
check_kind(results, 'hash')
local claim = redis.call('GET', claim_key)
if claim == 'done' then return {-1, 0} end
local sizes = redis.pcall('HMGET', size_key, 'size', 'extra')
if sizes['err'] then fail('WRONGTYPE', size_key .. ' is not a hash') end

if redis.call('SADD', parts, part) == 1 then redis.call('HSET', results, part, value) end
if lifetime > 0 then
  redis.call('PEXPIRE', parts, lifetime)
  redis.call('PEXPIRE', results, lifetime)
  if sizes[1] or sizes[2] then redis.call('PEXPIRE', size_key, lifetime) end
end
local seen = redis.call('SCARD', parts)
local size = tonumber(sizes[1]) or fallback
if size < 1 then return {seen, 0} end
if seen < size + (tonumber(sizes[2]) or 0) then return {seen, 0} end
if claim and claim ~= part then return {seen, 0} end
if lifetime > 0 then
  redis.call('SET', claim_key, part, 'PX', lifetime)
else
  redis.call('SET', claim_key, part)
end
local reply = {seen, 1}
for _, item in ipairs(redis.call('HGETALL', results)) do reply[#reply + 1] = item end
return reply
