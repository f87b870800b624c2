-- chord_part.lua: count one finished header task of a chord, once per
-- header entry however often the task ran, and decide atomically which call
-- dispatches the chord's body.
-- KEYS: 1 parts (set of "<task id>:<header index>" seen),
--       2 dispatch claim (string: the member that dispatches, or 'done').
-- ARGV: 1 member, 2 chord size, 3 lifetime of both keys in ms ('0' = none).
-- Returns: {parts seen (-1 once the body was dispatched), 1 if this call must
--   dispatch the body else 0}. The member holding the claim gets 1 again
--   when its task runs again (its worker died before dispatching).
local claim = redis.call('GET', KEYS[2])
if claim == 'done' then return {-1, 0} end
local lifetime = tonumber(ARGV[3])
redis.call('SADD', KEYS[1], ARGV[1])
if lifetime > 0 then redis.call('PEXPIRE', KEYS[1], lifetime) end
local seen = redis.call('SCARD', KEYS[1])
if seen < tonumber(ARGV[2]) then return {seen, 0} end
if claim and claim ~= ARGV[1] then return {seen, 0} end
if lifetime > 0 then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', lifetime)
else
  redis.call('SET', KEYS[2], ARGV[1])
end
return {seen, 1}
