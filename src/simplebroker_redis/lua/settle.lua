-- settle.lua: finish reserved messages of a token: 'claim' marks them
-- consumed (claimed, kept until vacuum), 'delete' removes them, 'move' makes
-- them pending in a target queue (same IDs). The token disappears once it
-- holds no more IDs.
-- uses: tokens, settling
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 token, 3 mode ('claim'|'delete'|'move'), 4 target
--       ('' = the target recorded at reserve time), 5.. 19-digit ids, or a
--       single '*' for every ID the token still holds.
-- Raises (before any write): ARG for an unknown mode or a move without a
-- target; the namespace checks.
-- Returns: {settled, lost}: `lost` counts requested IDs the token no longer
-- holds (recovered after lease expiry, or never reserved by it). An unknown
-- token settles nothing and reports every requested ID (or -1 for '*') lost.
local token, mode = ARGV[2], ARGV[3]
check_mode(mode)
local record = read_record(token)
if not record then
  if ARGV[5] == '*' then return {0, -1} end
  return {0, #ARGV - 4}
end
local target = settle_target(record, mode, ARGV[4])
local settled, lost = settle_ids(token, record, mode, target, selected_ids(token, 5))
return {settled, lost}
