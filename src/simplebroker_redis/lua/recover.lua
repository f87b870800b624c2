-- recover.lua: release reservations whose lease expired (stale-batch
-- recovery). Each token's record is re-read inside this script, so a token
-- that was settled, released or renewed in the meantime is skipped.
-- uses: guard, reservations, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue ('' = every queue), 3 max tokens per call.
-- Returns: {live IDs released, tokens recovered, 1 if more expired tokens
-- may remain}.
-- Raises: CORRUPT for a damaged token record or delivery count (nothing
-- changed for that token).
check_ns({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_DUE, K_DELIVERIES,
  K_OWNERS, K_TOKENS, K_TOKEN_IDS, K_LEASES})
return recover_expired(now_us(), ARGV[2], tonumber(ARGV[3]), false)
