-- lib/guard.lua: errors, and the checks every script makes before it writes.
-- uses: (nothing but the prelude)
--
-- Errors are raised as "SBR_<CODE> <detail>" and translated by errors.py,
-- whose SCRIPT_ERRORS table lists every code. Every script validates
-- before its first write, so a raised error never leaves a partial change.

local function fail(code, detail)
  error({err = 'SBR_' .. code .. ' ' .. (detail or '')})
end

-- Reject keys of the wrong type before anything is written.
local function check_keys(list)
  for _, key in ipairs(list) do
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'none' and kind ~= KEY_TYPES[key] then
      fail('WRONGTYPE', key .. ' holds a ' .. kind .. ', expected a ' .. KEY_TYPES[key])
    end
  end
end

-- Verify the namespace is initialized by this product and schema, then types.
local function check_ns(list)
  local kind = redis.call('TYPE', K_META)['ok']
  if kind == 'none' then fail('UNINITIALIZED', K_META) end
  if kind ~= 'hash' then fail('WRONGTYPE', K_META .. ' holds a ' .. kind .. ', expected a hash') end
  local meta = redis.call('HMGET', K_META, 'magic', 'schema_version')
  if meta[1] ~= MAGIC then fail('FOREIGN', K_META .. ' magic is ' .. tostring(meta[1])) end
  if meta[2] ~= SCHEMA then fail('SCHEMA', tostring(meta[2])) end
  check_keys(list)
end
