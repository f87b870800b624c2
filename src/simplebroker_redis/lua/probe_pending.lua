-- probe_pending.lua: whether one queue has a pending message (reserved and
-- delayed ones count, as in stats), optionally only above an ID. Read only.
-- uses: members
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue, 3 after ('' none: any ID).
-- Returns: 1 when such a message exists, else 0.
local lo, hi = bounds(ARGV[2], ARGV[3], '')
for _, key in ipairs({K_PENDING, K_RESERVED, K_DELAYED}) do
  if redis.call('ZRANGE', key, lo, hi, 'BYLEX', 'LIMIT', 0, 1)[1] then return 1 end
end
return 0
