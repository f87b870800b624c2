-- probe_latest.lua: the newest pending message ID of one queue (reserved
-- and delayed ones count, as in stats). Read only.
-- uses: members
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue.
-- Returns: that ID (19 digits), or false when the queue has none.
local queue = ARGV[2]
local best = false
for _, key in ipairs({K_PENDING, K_RESERVED, K_DELAYED}) do
  local newest = redis.call('ZRANGE', key, qhi(queue), qlo(queue), 'BYLEX', 'REV', 'LIMIT', 0, 1)[1]
  if newest and (not best or mid(newest) > best) then best = mid(newest) end
end
return best
