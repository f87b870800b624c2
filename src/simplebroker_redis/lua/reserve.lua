-- reserve.lua: reserve up to `limit` pending messages of a queue under a new
-- token (at-least-once delivery). Reserved messages stay pending for peek and
-- stats but nobody else can claim, move or delete them until the token is
-- settled, released, or recovered after its lease expires.
-- uses: guard, members, bulk, reservations, upkeep
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue, 3 token (fresh, [0-9a-f]), 4 limit,
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
local now, next_due = upkeep()

local members
if exact ~= '' then
  members = {}
  if redis.call('ZSCORE', K_PENDING, mem(queue, exact)) then members = {mem(queue, exact)} end
else
  local lo, hi = bounds(queue, after, before)
  members = range(K_PENDING, lo, hi, ARGV[12], limit)
end
local deadline = -1
if lease >= 0 then deadline = now + lease end
local due_in = '-1'
if next_due then due_in = string.format('%.0f', math.max(0, tonumber(next_due) - now)) end
local head = {string.format('%.0f', now), string.format('%.0f', deadline), due_in}
if #members == 0 then
  maintain(ARGV[13])
  return head
end

-- Reads (each also refuses a wrong-typed key), then the keys written unread.
local ids, bodies = bodies_of(members)
local counts = delivery_counts(ids)
check_keys({K_OWNERS, K_TOKEN_IDS, K_LEASES})

-- The first write: a wrong-typed reserved set fails here, before anything changed.
zadd_all(K_RESERVED, members)
zrem_all(K_PENDING, members)
local owners, links, delivered = {}, {}, {}
for i, id in ipairs(ids) do
  owners[#owners + 1] = id
  owners[#owners + 1] = token
  delivered[#delivered + 1] = id
  delivered[#delivered + 1] = counts[i] + 1
  links[i] = token .. ' ' .. id
  head[#head + 1] = id
  head[#head + 1] = bodies[i]
  head[#head + 1] = counts[i] + 1
end
hset_all(K_OWNERS, owners)
hset_all(K_DELIVERIES, delivered)
zadd_all(K_TOKEN_IDS, links)
redis.call('HSET', K_TOKENS, token, cjson.encode({
  q = queue, t = ARGV[6], c = head[1], d = head[2], l = ARGV[5],
  m = ARGV[10], x = ARGV[11],
}))
if deadline >= 0 then redis.call('ZADD', K_LEASES, head[2], token) end
maintain(ARGV[13])
return head
