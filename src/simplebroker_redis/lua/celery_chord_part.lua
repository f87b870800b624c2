-- celery_chord_part.lua: count one finished header entry of a chord, once
-- however often its task ran, and decide atomically which call dispatches
-- the chord's body (celery_simplebroker/backend.py).
-- uses: guard, celery
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the parts seen (set of "<task id>:<header index>"),
--       2 the dispatch claim (string: the part that dispatches, or 'done').
-- ARGV: 1 wake prefix, 2 this part ("<task id>:<header index>"), 3 the
--       chord's size, 4 lifetime of both keys in ms ('0' = none).
-- Returns: {parts seen (-1 once the body was dispatched), 1 if this call
--   must dispatch the body else 0}. The part holding the claim gets 1 again
--   when its task runs again (its worker died before the dispatch was
--   committed by celery_chord_dispatch.lua).
-- Raises (before any write): ARG (malformed arguments), WRONGTYPE.
celery_key_count(2)
local parts, claim_key = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
local part, size, lifetime = ARGV[2], tonumber(ARGV[3]), lifetime_ms(ARGV[4])
if not part or part == '' then fail('ARG', 'expected a part') end
if not size or size < 1 or size ~= math.floor(size) then fail('ARG', 'chord size ' .. tostring(ARGV[3])) end
check_kind(parts, 'set')
local claim = redis.call('GET', claim_key)
if claim == 'done' then return {-1, 0} end

redis.call('SADD', parts, part)
if lifetime > 0 then redis.call('PEXPIRE', parts, lifetime) end
local seen = redis.call('SCARD', parts)
if seen < size then return {seen, 0} end
if claim and claim ~= part then return {seen, 0} end
if lifetime > 0 then
  redis.call('SET', claim_key, part, 'PX', lifetime)
else
  redis.call('SET', claim_key, part)
end
return {seen, 1}
