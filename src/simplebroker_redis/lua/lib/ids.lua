-- lib/ids.lua: message-ID arithmetic on ID_WIDTH-digit decimal strings (IDs
-- exceed 2^53, so Lua's doubles cannot hold them) and ID allocation.
-- uses: guard

local function id_mod4096(id)
  local r = 0
  for i = 1, #id do r = (r * 10 + string.byte(id, i) - 48) % 4096 end
  return r
end

local function id_incr(id)
  local digits = {string.byte(id, 1, -1)}
  local i = #digits
  while i >= 1 do
    if digits[i] == 57 then
      digits[i] = 48
      i = i - 1
    else
      digits[i] = digits[i] + 1
      break
    end
  end
  if i == 0 then fail('IDRANGE', 'message ID overflow') end
  return string.char(unpack(digits))
end

-- The durable high-water mark as read from meta (false when absent); raises
-- CORRUPT unless it is an ID. Scripts read it with namespace_meta('last_ts').
local function high_water(value)
  value = value or ZERO_ID
  if #value ~= ID_WIDTH or not string.find(value, '^%d+$') then
    fail('CORRUPT', K_META .. ' last_ts is not a ' .. ID_WIDTH .. '-digit message ID')
  end
  return value
end

-- Allocate `count` increasing IDs above the durable high-water mark.
-- `candidates` are the client's hybrid timestamps (its clock), strictly
-- increasing. A candidate that names a stored message is refused (IDCONFLICT,
-- the client backs off and retries); a stale one (at or below the high-water)
-- is replaced by the next free ID, so a client with a lagging clock still
-- writes in one round trip. A single ID whose logical counter would overflow
-- fails with CLOCK, as SimpleBroker's generator does; a multi-ID allocation
-- may borrow the following 4.096 us grains. Beyond the candidates given,
-- IDs are consecutive. `floor` is the high-water mark (see high_water()).
local function allocate(candidates, count, floor)
  for i, candidate in ipairs(candidates) do
    if i > 1 and candidate <= candidates[i - 1] then fail('DUPCANDIDATE', candidate) end
    if redis.call('HEXISTS', K_BODIES, candidate) == 1 then fail('IDCONFLICT', candidate) end
  end
  local ids = {}
  for i = 1, count do
    local candidate = candidates[i]
    if candidate and candidate > floor then
      ids[i] = candidate
    else
      if count == 1 and id_mod4096(floor) == 4095 then fail('CLOCK', floor) end
      ids[i] = id_incr(floor)
      if redis.call('HEXISTS', K_BODIES, ids[i]) == 1 then fail('IDCONFLICT', ids[i]) end
    end
    floor = ids[i]
  end
  if ids[count] > MAX_ID then fail('IDRANGE', 'timestamp too far in future') end
  return ids
end
