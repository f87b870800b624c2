-- celery_chord_size.lua: start a new run of a chord (Celery's apply_chord,
-- before the header's first task is sent) and set the number of header
-- entries that complete it (set_chord_size, as the last one is sent). A
-- frozen chord applied again reuses its group ID: the previous run's 'done'
-- mark is removed before any entry of the new run can find it.
-- uses: guard, celery
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the parts, 2 the dispatch claim, 3 the size, 4 the results, as
--       in celery_chord_part.lua.
-- ARGV: 1 wake prefix, 2 the size (a whole number >= 0; '' = only start
--       the run), 3 lifetime of the size in ms ('0' = none).
-- Returns: 1.
-- Raises (before any write): ARG, WRONGTYPE.
celery_key_count(4)
local claim_key, size_key = KEYS[FIXED_KEYS + 2], KEYS[FIXED_KEYS + 3]
local size, lifetime = tonumber(ARGV[2]), lifetime_ms(ARGV[3])
if ARGV[2] ~= '' and (not size or size < 0 or size ~= math.floor(size)) then
  fail('ARG', 'chord size ' .. tostring(ARGV[2]))
end
check_kind(size_key, 'hash')
check_kind(claim_key, 'string')
if redis.call('GET', claim_key) == 'done' then redis.call('DEL', claim_key) end
if ARGV[2] == '' then return 1 end
redis.call('HSET', size_key, 'size', size)
if lifetime > 0 then redis.call('PEXPIRE', size_key, lifetime) end
return 1
