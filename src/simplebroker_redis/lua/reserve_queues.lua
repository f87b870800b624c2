-- reserve_queues.lua: reserve up to `limit` pending messages from several
-- queues in one step, in strict order: all the first queue has (oldest
-- first), then the second's, and so on. Each queue that gives messages gets
-- its own token (a reservation is of one queue, as in reserve.lua), so
-- leases, recovery and dead-lettering stay per queue. Used by Taskiq
-- workers for priorities (a queue's priority queues, highest first) and for
-- listening on several queues.
-- uses: guard, members, bulk, reservations, upkeep
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 token prefix (fresh, [0-9a-f]; the tokens are
--       '<prefix>-<n>' for the n-th queue), 3 limit, 4 lease in us ('-1' =
--       never expires), 5 max deliveries ('0' = unlimited), then pairs
--       (queue, its dead-letter queue or '' for none).
-- Returns: {created_us, deadline_us ('-1' none), next_due_in_us ('-1' none),
--           then per queue that gave messages: token, queue, count, and
--           count triples id, body, deliveries}.
-- Raises: ARG for a malformed list; TOKEN when a token already exists.
local prefix, limit, lease = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if not limit or limit < 1 or not lease or (#ARGV - 5) % 2 ~= 0 or #ARGV < 7 then
  fail('ARG', 'expected a limit, a lease and (queue, dead-letter queue) pairs')
end
local now, next_due = upkeep()
local deadline = -1
if lease >= 0 then deadline = now + lease end
local due_in = '-1'
if next_due then due_in = string.format('%.0f', math.max(0, tonumber(next_due) - now)) end
local head = {string.format('%.0f', now), string.format('%.0f', deadline), due_in}

-- Which queues hold anything at all (one read), then the pending messages
-- of those, in order, up to the limit.
local names = {}
for i = 6, #ARGV, 2 do names[#names + 1] = ARGV[i] end
local known = zmscore_all(K_QUEUES, names)
local picked, left = {}, limit
for n, queue in ipairs(names) do
  if left <= 0 then break end
  if known[n] then
    local members = range(K_PENDING, qlo(queue), qhi(queue), 'oldest', left)
    if #members > 0 then
      local token = prefix .. '-' .. n
      if redis.call('HEXISTS', K_TOKENS, token) == 1 then fail('TOKEN', 'token ' .. token .. ' is in use') end
      picked[#picked + 1] = {queue = queue, dead = ARGV[5 + 2 * n], token = token, members = members}
      left = left - #members
    end
  end
end
if #picked == 0 then return head end

-- Reads (each also refuses a wrong-typed key), then the keys written unread.
for _, pick in ipairs(picked) do
  pick.ids, pick.bodies = bodies_of(pick.members)
  pick.counts = delivery_counts(pick.ids)
end
check_keys({K_RESERVED, K_OWNERS, K_TOKEN_IDS, K_LEASES})

for _, pick in ipairs(picked) do
  head[#head + 1] = pick.token
  head[#head + 1] = pick.queue
  head[#head + 1] = #pick.ids
  reserve_members(pick.token, {
    q = pick.queue, t = '', c = head[1], d = head[2], l = ARGV[4],
    m = ARGV[5], x = pick.dead,
  }, pick.members, pick.ids, pick.bodies, pick.counts, head)
end
return head
