-- reserve.lua: reserve up to `limit` pending messages of a queue under a new
-- token (at-least-once delivery). Reserved messages stay pending for peek and
-- stats but nobody else can claim, move or delete them until the token is
-- settled, released, or recovered after its lease expires.
-- uses: guard, members, bulk, tokens, reserving, upkeep
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue, 3 token (fresh, [0-9a-f], or
--       '<holder>.<random>': the upkeep spares that holder's tokens), 4 limit,
--       5 lease in us ('-1' = never expires), 6 move target recorded for
--       settle ('' none), 7 after, 8 before, 9 exact, 10 max deliveries ('0' =
--       unlimited), 11 dead-letter queue ('' none), 12 order, 13 maintenance
--       spec ('' when not due; see maintain() in lib/upkeep.lua).
-- Returns: {created_us, deadline_us ('-1' none), next_due_in_us ('-1' none),
--           id1, body1, deliveries1, ...}; no items when nothing was pending.
-- Raises: TOKEN when the token already exists.
local queue, token, limit, lease = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local after, before, exact = ARGV[7], ARGV[8], ARGV[9]
if redis.call('HEXISTS', K_TOKENS, token) == 1 then fail('TOKEN', 'token ' .. token .. ' is in use') end
local head = open_reservation(lease, token)

local members
if exact ~= '' then
  members = {}
  if redis.call('ZSCORE', K_PENDING, mem(queue, exact)) then members = {mem(queue, exact)} end
else
  local lo, hi = bounds(queue, after, before)
  members = range(K_PENDING, lo, hi, ARGV[12], limit)
end
if #members == 0 then
  maintain(ARGV[13])
  return head
end

-- Reads (each also refuses a wrong-typed key), then the keys written unread.
local ids, bodies = bodies_of(members)
local counts = delivery_counts(ids)
check_keys({K_OWNERS, K_TOKEN_IDS, K_LEASES})

-- The first write: a wrong-typed reserved set fails here, before anything changed.
reserve_members(token, {
  q = queue, t = ARGV[6], c = head[1], d = head[2], l = ARGV[5],
  m = ARGV[10], x = ARGV[11],
}, members, ids, bodies, counts, head)
maintain(ARGV[13])
return head
