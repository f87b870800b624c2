-- lib/time.lua: the server clock.
-- uses: (nothing but the prelude)

-- Server time in integer microseconds (exact in a double until year 2255).
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
