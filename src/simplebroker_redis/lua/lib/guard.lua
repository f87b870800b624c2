-- lib/guard.lua: errors, and the checks a script makes before its first write.
-- uses: (nothing but the prelude)
--
-- Errors are raised as "SBR_<CODE> <detail>" and translated by errors.py,
-- whose SCRIPT_ERRORS table lists every code. A script never writes before
-- it has validated its input and refused damaged data, so a raised error
-- never leaves a partial change. A key of the wrong type is refused by the
-- first command that touches it: a read before any write, the script's
-- first write itself, or check_keys() for a key written without being read.
-- A key this call already read with a command of its type (verified()) or
-- checked needs no TYPE of its own: a wrong type would have failed there.

local function fail(code, detail)
  error({err = 'SBR_' .. code .. ' ' .. (detail or '')})
end

-- Record that `key` holds its own type or nothing: call after a read of it
-- that only that type (or a missing key) answers has succeeded.
local function verified(key)
  VERIFIED[key] = true
end

-- Reject keys of the wrong type (one TYPE each, none for a verified key).
local function check_keys(list)
  for _, key in ipairs(list) do
    if not VERIFIED[key] then
      local kind = redis.call('TYPE', key)['ok']
      if kind ~= 'none' and kind ~= key_type(key) then
        fail('WRONGTYPE', key .. ' holds a ' .. kind .. ', expected a ' .. key_type(key))
      end
      VERIFIED[key] = true
    end
  end
end

-- Refuse a namespace that is not ours (or not initialized), and return the
-- meta fields asked for: one HMGET, which also refuses a wrong-typed meta.
-- A meta record without magic is UNINITIALIZED: the runner then runs
-- init.lua, which creates it, or reports FOREIGN for a record not ours.
local function namespace_meta(...)
  local got = redis.call('HMGET', K_META, 'magic', 'schema_version', ...)
  if got[1] ~= MAGIC then
    if not got[1] then fail('UNINITIALIZED', K_META) end
    fail('FOREIGN', K_META .. ' magic is ' .. tostring(got[1]))
  end
  if got[2] ~= SCHEMA then fail('SCHEMA', tostring(got[2])) end
  return unpack(got, 3)
end
