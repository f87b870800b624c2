-- dead_letter_ack.lua: take one entry out of the dead-letter journal (it was
-- reported), optionally storing a value (the task's error result) unless
-- its key holds one already. Whoever removes the entry reports it: of many
-- consumers racing for one entry, exactly one gets 'acked'.
-- uses: guard
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then at
--       most one key to store the value at (inside the namespace).
-- ARGV: 1 wake prefix, 2 journal entry ID, 3 value ('' with no key),
--       4 its expiry in ms ('' keeps it).
-- Returns: {1 if this call removed the entry else 0, 1 if it stored the
--          value else 0}; a removed entry stores nothing.
-- Raises (before any write): ARG for a malformed expiry or key count.
local extra = #KEYS - FIXED_KEYS
local entry, value, px = ARGV[2], ARGV[3], ARGV[4]
if extra < 0 or extra > 1 then fail('ARG', 'at most one value key') end
if px == nil or (px ~= '' and not string.find(px, '^[1-9]%d*$')) then fail('ARG', 'expiry ' .. tostring(px)) end
-- Read first: a wrong-typed journal fails here, before anything changed.
if #redis.call('XRANGE', K_DEAD_LETTERS, entry, entry) == 0 then return {0, 0} end
local stored = 0
if extra == 1 then
  local reply
  if px == '' then
    reply = redis.call('SET', KEYS[FIXED_KEYS + 1], value, 'NX')
  else
    reply = redis.call('SET', KEYS[FIXED_KEYS + 1], value, 'PX', px, 'NX')
  end
  if reply then stored = 1 end
end
redis.call('XDEL', K_DEAD_LETTERS, entry)
return {1, stored}
