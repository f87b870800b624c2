-- lib/ordered.lua: reserving from several queues in strict order, one
-- token per queue that gives messages (reserve_queues.lua, and the
-- reservation celery_store.lua can make with a result).
-- uses: guard, members, bulk, tokens, reserving

-- The (queue, dead-letter queue or '') pairs of ARGV[first..]: their
-- queues and, at the same index, their dead-letter queues. The caller
-- checked that the pairs are complete.
local function queue_pairs(first)
  local names, deads = {}, {}
  for i = first, #ARGV, 2 do
    names[#names + 1] = ARGV[i]
    deads[#deads + 1] = ARGV[i + 1]
  end
  return names, deads
end

-- Plan a reservation of up to `limit` pending messages from the queues
-- `names`, in strict order: all the first queue has (oldest first), then the
-- second's, and so on; one token per queue that gives messages,
-- '<prefix>-<n>' for the n-th name, dead-lettering to deads[n] ('' none).
-- Reads only (every key checked); raises TOKEN for a token in use. An empty
-- plan when nothing is pending.
local function plan_ordered(prefix, limit, names, deads)
  local known = zmscore_all(K_QUEUES, names)
  local picked, left = {}, limit
  for n, queue in ipairs(names) do
    if left <= 0 then break end
    if known[n] then
      local members = range(K_PENDING, qlo(queue), qhi(queue), 'oldest', left)
      if #members > 0 then
        local token = prefix .. '-' .. n
        if redis.call('HEXISTS', K_TOKENS, token) == 1 then fail('TOKEN', 'token ' .. token .. ' is in use') end
        picked[#picked + 1] = {queue = queue, dead = deads[n], token = token, members = members}
        left = left - #members
      end
    end
  end
  for _, pick in ipairs(picked) do
    pick.ids, pick.bodies = bodies_of(pick.members)
    pick.counts = delivery_counts(pick.ids)
  end
  if #picked > 0 then check_keys({K_RESERVED, K_OWNERS, K_TOKEN_IDS, K_LEASES}) end
  return picked
end

-- Apply a plan of plan_ordered (writes only): each token's record {created,
-- deadline, lease and max deliveries as given}, and, appended to `out`, its
-- token, queue, count and the count triples id, body, deliveries.
local function apply_ordered(picked, created, deadline, lease, max_deliveries, out)
  for _, pick in ipairs(picked) do
    out[#out + 1] = pick.token
    out[#out + 1] = pick.queue
    out[#out + 1] = #pick.ids
    reserve_members(pick.token, {
      q = pick.queue, t = '', c = created, d = deadline, l = lease,
      m = max_deliveries, x = pick.dead,
    }, pick.members, pick.ids, pick.bodies, pick.counts, out)
  end
end
