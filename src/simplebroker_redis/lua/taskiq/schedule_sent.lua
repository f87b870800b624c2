-- schedule_sent.lua: confirm that a claimed schedule run was sent (see
-- schedule_claim.lua): it leaves schedule_claims and is never sent again.
-- uses: (nothing but the prelude)
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 schedule id, 3 run (as schedule_claim.lua named it).
-- Returns: 1 when the claim was still there, else 0.
return redis.call('HDEL', K_SCHEDULE_CLAIMS, ARGV[2] .. ' ' .. ARGV[3])
