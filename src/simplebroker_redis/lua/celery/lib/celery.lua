-- lib/celery.lua: the Celery integration's keys, which a script receives
-- after the namespace's fixed keys (calls/celery.py: entry_key, chord_keys; keys.py: Keyspace.celery). The
-- prelude knows the fixed keys' types; these scripts check their own.
-- uses: guard

-- Refuse a call that did not pass exactly `count` keys after the fixed ones.
local function celery_key_count(count)
  if #KEYS ~= FIXED_KEYS + count then
    fail('ARG', 'expected ' .. count .. ' Celery keys after the fixed keys, got ' .. (#KEYS - FIXED_KEYS))
  end
end

-- Refuse a Celery key that holds another Redis type than `kind` (one TYPE).
local function check_kind(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= kind then
    fail('WRONGTYPE', key .. ' holds a ' .. found .. ', expected a ' .. kind)
  end
end

-- A lifetime in milliseconds from ARGV: a whole number >= 0 ('0' = none).
local function lifetime_ms(value)
  local ms = tonumber(value)
  if not ms or ms < 0 or ms ~= math.floor(ms) then fail('ARG', 'lifetime ' .. tostring(value)) end
  return ms
end
