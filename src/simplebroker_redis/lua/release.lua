-- release.lua: give reserved messages of a token back: pending again at once,
-- or delayed (pending but not claimable) for a while.
-- uses: tokens, releasing, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 token, 3 delay in us ('0' = claimable now),
--       4 '1' to take back the delivery count (never handed to a handler),
--       5.. 19-digit ids, or a single '*' for every ID the token holds.
-- Returns: number of IDs released (a message past its max deliveries goes to
-- the token's dead-letter queue and is counted too). Unknown tokens release 0.
-- Raises (before any write): WRONGTYPE for a key of the wrong type; CORRUPT
--         for damaged data.
local token = ARGV[2]
local record = read_record(token)
if not record then return 0 end
check_reservation_keys()
local delay = tonumber(ARGV[3])
local due = 0
if delay > 0 then due = now_us() + delay end
return release_ids(token, record, selected_ids(token, 5), due, ARGV[4] == '1')
