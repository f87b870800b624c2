-- lib/releasing.lua: giving reserved messages back (pending, delayed, or
-- dead-lettered), on request or when their lease expired.
-- uses: guard, members, bulk, counters, tokens, dead_lettering

-- Return reserved `ids` of a token to pending, or to delayed until `due`
-- (server us). Only IDs still owned by `token` move, so a stale caller can
-- never release a newer reservation of the same message. `undeliver` takes
-- back the delivery count (the messages never reached a handler). A message
-- that used up the record's max deliveries goes to its dead-letter queue
-- (see dying() and dead_letter()).
-- The caller ran check_reservation_keys(). Returns the number moved.
-- `event` names what the moved ones are counted as ('released' unless given).
local function release_ids(token, record, ids, due, undeliver, event)
  local queue = record.q
  local owned = held_ids(token, queue, ids)
  local counts = delivery_counts(owned)
  -- Which messages die is known before the first write, and so is whether
  -- the journal (not among the reservation keys) is written.
  local dies = dying(record, counts, undeliver) or {}
  local drop = {}
  for i, id in ipairs(ids) do drop[i] = token .. ' ' .. id end
  local moved = {}
  for i, id in ipairs(owned) do
    local member = mem(queue, id)
    redis.call('ZREM', K_RESERVED, member)
    redis.call('HDEL', K_OWNERS, id)
    if undeliver and counts[i] > 0 then
      redis.call('HINCRBY', K_DELIVERIES, id, -1)
    end
    if not dies[i] then moved[#moved + 1] = member end
  end
  zrem_all(K_TOKEN_IDS, drop)
  if #moved > 0 then
    if due and due > 0 then
      zadd_all(K_DELAYED, moved)
      for _, member in ipairs(moved) do
        redis.call('ZADD', K_DUE, string.format('%.0f', due), member)
      end
    else
      zadd_all(K_PENDING, moved)
    end
    wake(queue)
    count_event(queue, event or 'released', #moved)
  end
  local dead = 0
  if #moved < #owned then dead = dead_letter(queue, record.x, owned, counts, dies) end
  if not token_holds_any(token) then drop_token(token) end
  return #moved + dead
end

-- Whether recovery leaves `token` alone: `spare` is nil (spare nothing), or
-- {holder = prefix or nil, tokens = set or nil}: the caller's own tokens,
-- named by their holder prefix ('<holder>.<random>', see holder_of) or one
-- by one. A worker renews what it holds; a reply held up by the network
-- must not let its own request recover it first.
local function spared(token, spare)
  if not spare then return false end
  if spare.tokens and spare.tokens[token] then return true end
  local holder = spare.holder
  return holder ~= nil and string.sub(token, 1, #holder + 1) == holder .. '.'
end

-- The holder named by a token (or a token prefix) '<holder>.<random>', or
-- nil for a token that names none. Holders are hex, as are tokens.
local function holder_of(token)
  return string.match(token or '', '^(%x+)%.')
end

-- Recover one expired token; returns IDs released, or -1 when it was skipped.
local function recover_token(token, now, queue)
  local record = read_record(token)
  if not record then
    redis.call('ZREM', K_LEASES, token)
    return -1
  end
  local deadline = tonumber(record.d)
  if (queue ~= '' and record.q ~= queue) or deadline < 0 or deadline >= now then
    return -1
  end
  return release_ids(token, record, ids_of(token_members(token)), 0, false, 'recovered')
end

-- Release every reservation whose lease deadline is before `now` (at most
-- `max_tokens` of them, optionally only those of `queue`), except those
-- `spare` names (see spared; `spare.count` of them at most, so that many
-- more are read and `more` stays true only while unspared ones may be
-- left). Age is qualified in exact integer microseconds of server time,
-- re-read from the token's own record. A damaged token raises CORRUPT,
-- unless `lenient` (the upkeep that starts every claim), which skips it so
-- one bad record cannot stop every reader of the namespace; each token
-- validates before it writes, so a skipped token changed nothing. The types
-- of every key are checked before the first token is touched. Returns {IDs
-- released, tokens, more left}.
local function recover_expired(now, queue, max_tokens, lenient, spare)
  local read = max_tokens + ((spare and spare.count) or 0)
  local tokens = redis.call('ZRANGE', K_LEASES, '-inf', '(' .. string.format('%.0f', now),
    'BYSCORE', 'LIMIT', 0, read)
  verified(K_LEASES)
  local released, recovered = 0, 0
  if #tokens > 0 then check_reservation_keys() end
  for _, token in ipairs(tokens) do
    local ok, got = true, -1
    if spared(token, spare) then
      ok = false
    elseif lenient then
      ok, got = pcall(recover_token, token, now, queue)
    else
      got = recover_token(token, now, queue)
    end
    if ok and got >= 0 then
      released = released + got
      recovered = recovered + 1
    end
  end
  local more = 0
  if #tokens == read then more = 1 end
  return {released, recovered, more}
end
