-- lib/dramatiq.lua: the Dramatiq integration's keys, which a script receives
-- after the namespace's fixed keys (calls/dramatiq.py builds them with
-- keys.py's Keyspace.dramatiq). The prelude knows the fixed keys' types;
-- these scripts check their own.
-- uses: guard

-- Refuse a call that did not pass exactly `count` keys after the fixed ones.
local function dramatiq_key_count(count)
  if #KEYS ~= FIXED_KEYS + count then
    fail('ARG', 'expected ' .. count .. ' Dramatiq keys after the fixed keys, got ' .. (#KEYS - FIXED_KEYS))
  end
end

-- Refuse a Dramatiq key that holds another Redis type than `kind` (one TYPE).
local function dramatiq_check_kind(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= kind then
    fail('WRONGTYPE', key .. ' holds a ' .. found .. ', expected a ' .. kind)
  end
end

-- A whole number >= 0 from ARGV (`what` names it in the error).
local function dramatiq_count(value, what)
  local n = tonumber(value)
  if not n or n < 0 or n ~= math.floor(n) then fail('ARG', what .. ' ' .. tostring(value)) end
  return n
end
