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
check_ns({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_DUE, K_CLAIMED, K_BODIES,
  K_OWNERS, K_TOKENS, K_TOKEN_IDS, K_LEASES, K_DELIVERIES})
local queue, token, limit, lease = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local after, before, exact = ARGV[7], ARGV[8], ARGV[9]
if redis.call('HEXISTS', K_TOKENS, token) == 1 then fail('TOKEN', 'token ' .. token .. ' is in use') end
local now = upkeep()

local function next_due()
  local first = redis.call('ZRANGE', K_DUE, 0, 0, 'WITHSCORES')
  if first[2] then return string.format('%.0f', math.max(0, tonumber(first[2]) - now)) end
  return '-1'
end

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
local head = {string.format('%.0f', now), string.format('%.0f', deadline), next_due()}
if #members == 0 then
  maintain(ARGV[13])
  return head
end

local bodies = bodies_of(members)
for _, member in ipairs(members) do delivery_count(mid(member)) end
zrem_all(K_PENDING, members)
zadd_all(K_RESERVED, members)
local links = {}
for i, member in ipairs(members) do
  local id = mid(member)
  redis.call('HSET', K_OWNERS, id, token)
  links[i] = token .. ' ' .. id
  head[#head + 1] = id
  head[#head + 1] = bodies[i]
  head[#head + 1] = redis.call('HINCRBY', K_DELIVERIES, id, 1)
end
zadd_all(K_TOKEN_IDS, links)
redis.call('HSET', K_TOKENS, token, cjson.encode({
  q = queue, t = ARGV[6], c = head[1], d = head[2], l = ARGV[5],
  m = ARGV[10], x = ARGV[11],
}))
if deadline >= 0 then redis.call('ZADD', K_LEASES, head[2], token) end
maintain(ARGV[13])
return head
