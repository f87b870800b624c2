-- recover.lua: release reservations whose lease expired (stale-batch
-- recovery). Each token's record is re-read inside this script, so a token
-- that was settled, released or renewed in the meantime is skipped.
-- uses: releasing, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue ('' = every queue), 3 max tokens per call,
--       4.. tokens to leave alone (the caller's own, which it renews: a
--       worker's heartbeat names what it holds, so its recovery never takes
--       them even when its renewal arrives late).
-- Returns: {live IDs released, tokens recovered, 1 if more expired tokens
-- may remain}.
-- Raises: CORRUPT for a damaged token record or delivery count (nothing
-- changed for that token).
local spare = nil
if #ARGV > 3 then
  spare = {tokens = {}, count = #ARGV - 3}
  for i = 4, #ARGV do spare.tokens[ARGV[i]] = true end
end
return recover_expired(now_us(), ARGV[2], tonumber(ARGV[3]), false, spare)
