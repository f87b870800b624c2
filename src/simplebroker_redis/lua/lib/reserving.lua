-- lib/reserving.lua: making a reservation: the upkeep and lease header it
-- opens with, and the writes that put messages under a new token.
-- uses: bulk, counters, releasing, upkeep

-- Start a reservation of lease `lease` (us, or -1 for none): run upkeep()
-- (expired reservations back, due messages pending) before anything reads
-- what it may change, and return the head of the reply: {created_us,
-- deadline_us ('-1' none), next_due_in_us ('-1' when nothing is delayed)}.
-- `token` (optional): the new token, or token prefix; when it names a
-- holder ('<holder>.<random>'), the upkeep spares that holder's tokens.
local function open_reservation(lease, token)
  local now, next_due = upkeep(holder_of(token))
  local deadline, due_in = -1, '-1'
  if lease >= 0 then deadline = now + lease end
  if next_due then due_in = string.format('%.0f', math.max(0, tonumber(next_due) - now)) end
  return {string.format('%.0f', now), string.format('%.0f', deadline), due_in}
end

-- Reserve `members` (already read: their `ids`, `bodies` and delivery
-- `counts`, and every key checked) under a new token whose `record` is
-- {q, t, c, d, l, m, x}: RESERVED, one delivery more each, linked to the
-- token, and the token's record and lease. Appends id, body, deliveries of
-- each message to `out`. Writes only; reserved is written first.
local function reserve_members(token, record, members, ids, bodies, counts, out)
  zadd_all(K_RESERVED, members)
  zrem_all(K_PENDING, members)
  local owners, links, delivered = {}, {}, {}
  for i, id in ipairs(ids) do
    owners[2 * i - 1] = id
    owners[2 * i] = token
    delivered[2 * i - 1] = id
    delivered[2 * i] = counts[i] + 1
    links[i] = token .. ' ' .. id
    out[#out + 1] = id
    out[#out + 1] = bodies[i]
    out[#out + 1] = counts[i] + 1
  end
  hset_all(K_OWNERS, owners)
  hset_all(K_DELIVERIES, delivered)
  zadd_all(K_TOKEN_IDS, links)
  redis.call('HSET', K_TOKENS, token, cjson.encode(record))
  count_event(record.q, 'delivered', #ids)
  if tonumber(record.d) >= 0 then redis.call('ZADD', K_LEASES, record.d, token) end
end
