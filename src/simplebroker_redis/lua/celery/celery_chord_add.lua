-- celery_chord_add.lua: count one more header entry of a running chord
-- (Celery's add_to_chord: a header task adds a task to its own chord before
-- it sends it, so the chord waits for that task too).
-- uses: celery
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the parts, 2 the dispatch claim, 3 the size, 4 the results, as
--       in celery_chord_part.lua.
-- ARGV: 1 wake prefix, 2 lifetime of the size in ms ('0' = none).
-- Returns: the number of entries added so far.
-- Raises (before any write): ARG, WRONGTYPE.
celery_key_count(4)
local size_key = KEYS[FIXED_KEYS + 3]
local lifetime = lifetime_ms(ARGV[2])
check_kind(size_key, 'hash')
local extra = redis.call('HINCRBY', size_key, 'extra', 1)
if lifetime > 0 then redis.call('PEXPIRE', size_key, lifetime) end
return extra
