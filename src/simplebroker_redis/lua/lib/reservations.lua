-- lib/reservations.lua: tokens, their records, settling, releasing and
-- recovering reserved messages.
-- uses: guard, members, bulk, counters
--
-- A reservation is a token: tokens[token] holds its JSON record {q, t, c,
-- d, l, m, x} (queue, move target, created us, deadline us or -1, lease us,
-- max deliveries, dead-letter queue), token_ids holds "<token> <id>" per
-- reserved id, owners[id] = token, and leases scores the token by deadline.
-- A message dead-lettered after its max deliveries also gets an entry in
-- the dead_letters stream (the journal consumers report from).
--
-- Settling and releasing are planned first (every read, which also refuses
-- a wrong-typed key) and applied after (writes), so a script that settles
-- several tokens validates all of them before its first write.

-- Check the types of the keys a reservation change writes (before its
-- first write). The list is built per call: module code runs before bind()
-- names the keys, so a table built at load time would hold nothing.
local function check_reservation_keys()
  check_keys({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_DUE, K_CLAIMED,
    K_BODIES, K_DELIVERIES, K_OWNERS, K_TOKENS, K_TOKEN_IDS, K_LEASES})
end

local function token_lo(token) return '[' .. token .. ' ' end
local function token_hi(token) return '(' .. token .. '!' end

local function token_members(token)
  return redis.call('ZRANGE', K_TOKEN_IDS, token_lo(token), token_hi(token), 'BYLEX')
end

-- How many IDs the token links (reads token_ids before any write).
local function token_links(token)
  local count = redis.call('ZLEXCOUNT', K_TOKEN_IDS, token_lo(token), token_hi(token))
  verified(K_TOKEN_IDS)
  return count
end

local function drop_token(token)
  redis.call('HDEL', K_TOKENS, token)
  redis.call('ZREM', K_LEASES, token)
end

-- Decode the record `raw` of a token; raises CORRUPT when it is damaged
-- (not JSON, or fields missing).
local function decode_record(token, raw)
  local ok, record = pcall(cjson.decode, raw)
  if not ok or type(record) ~= 'table' or type(record.q) ~= 'string'
    or tonumber(record.d) == nil or tonumber(record.l) == nil then
    fail('CORRUPT', 'reservation ' .. token .. ' has a damaged record')
  end
  return record
end

-- Read and decode a token's record; nil when the token does not exist.
local function read_record(token)
  local raw = redis.call('HGET', K_TOKENS, token)
  verified(K_TOKENS)
  if not raw then return nil end
  return decode_record(token, raw)
end

-- Delivery counts of `ids` (one HMGET); raises CORRUPT for one that is not a count.
local function delivery_counts(ids)
  local raw = hmget_all(K_DELIVERIES, ids)
  local counts = {}
  for i, id in ipairs(ids) do
    local count = tonumber(raw[i] or '0')
    if not count or count < 0 or count ~= math.floor(count) then
      fail('CORRUPT', 'message ' .. id .. ' has a damaged delivery count')
    end
    counts[i] = count
  end
  return counts
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

-- Raise ARG unless `mode` is a settlement mode.
local function check_mode(mode)
  if mode ~= 'claim' and mode ~= 'delete' and mode ~= 'move' then
    fail('ARG', 'settlement mode ' .. tostring(mode))
  end
end

-- The target queue of a settlement: `target`, or the one recorded at
-- reserve time when it is ''. Raises ARG for a move without a usable target.
local function settle_target(record, mode, target)
  if target == '' then target = record.t end
  if mode == 'move' and (not target or target == '' or target == record.q) then
    fail('ARG', 'move needs a target queue')
  end
  return target
end

-- The IDs a settlement names: ARGV[first..], or every ID the token holds
-- when that is the single argument '*'.
local function selected_ids(token, first)
  if ARGV[first] == '*' then return ids_of(token_members(token)) end
  local ids = {}
  for i = first, #ARGV do ids[#ids + 1] = ARGV[i] end
  return ids
end

-- The IDs of `ids` that `token` still holds in `queue`, in order (reads
-- owners and reserved).
local function held_ids(token, queue, ids)
  if #ids == 0 then return {} end
  local owners = hmget_all(K_OWNERS, ids)
  local members = {}
  for i, id in ipairs(ids) do members[i] = mem(queue, id) end
  local reserved = zmscore_all(K_RESERVED, members)
  local held = {}
  for i, id in ipairs(ids) do
    if owners[i] == token and reserved[i] then held[#held + 1] = id end
  end
  return held
end

-- Whether `queue` still holds a message once `leaving` of its reserved
-- messages are gone (reads only; call before the writes). Reserved first:
-- a consumer settling one message usually holds others of the queue.
local function keeps_rows(queue, leaving)
  return lexcount(K_RESERVED, queue) > leaving or first_in(K_PENDING, queue)
    or first_in(K_DELAYED, queue) or first_in(K_CLAIMED, queue)
end

-- Plan the settlement of `ids` of a token whose `record` was read (reads
-- only): 'claim' marks them consumed, 'delete' removes them, 'move' makes
-- them pending in `target`. IDs the token no longer holds are lost.
local function settle_plan(token, record, mode, target, ids)
  local done = held_ids(token, record.q, ids)
  -- A move to the reservation's dead-letter queue is a rejection: counted as dead-lettered.
  local event = 'acknowledged'
  if mode == 'move' and target ~= '' and target == record.x then event = 'dead_lettered' end
  return {token = token, queue = record.q, mode = mode, target = target, done = done,
    lost = #ids - #done, event = event}
end

-- Check every key the plans write without having read it, count each
-- token's links (shared by its plans), and decide which source queues lose
-- their last message (per queue, over all plans). Returns the queues to
-- unregister.
local function settle_prepare(plans)
  local leaving, kept, modes, links = {}, {}, {}, {}
  for _, plan in ipairs(plans) do
    if not links[plan.token] then links[plan.token] = {left = token_links(plan.token)} end
    plan.links = links[plan.token]
    if #plan.done > 0 then
      modes[plan.mode] = true
      if plan.mode == 'claim' then
        kept[plan.queue] = true
      else
        if plan.mode == 'move' then kept[plan.target] = true end
        leaving[plan.queue] = (leaving[plan.queue] or 0) + #plan.done
      end
    end
  end
  local emptied = {}
  for queue, count in pairs(leaving) do
    if not kept[queue] and not keeps_rows(queue, count) then emptied[#emptied + 1] = queue end
  end
  local checks = {K_LEASES}
  if modes.claim then checks[#checks + 1] = K_CLAIMED end
  if modes.delete then
    checks[#checks + 1] = K_BODIES
    checks[#checks + 1] = K_DELIVERIES
  end
  if modes.move then checks[#checks + 1] = K_PENDING end
  if modes.move or #emptied > 0 then checks[#checks + 1] = K_QUEUES end
  check_keys(checks)
  return emptied
end

-- Apply a settlement plan (writes only). Returns settled, lost.
local function settle_apply(plan)
  local token, queue, done = plan.token, plan.queue, plan.done
  if #done > 0 then
    local members, links = {}, {}
    for i, id in ipairs(done) do
      members[i] = mem(queue, id)
      links[i] = token .. ' ' .. id
    end
    zrem_all(K_RESERVED, members)
    hdel_all(K_OWNERS, done)
    plan.links.left = plan.links.left - zrem_all(K_TOKEN_IDS, links)
    if plan.mode == 'claim' then
      zadd_all(K_CLAIMED, members)
    elseif plan.mode == 'delete' then
      hdel_all(K_BODIES, done)
      hdel_all(K_DELIVERIES, done)
    else
      local moved = {}
      for i, id in ipairs(done) do moved[i] = mem(plan.target, id) end
      zadd_all(K_PENDING, moved)
      register(plan.target)
      wake(plan.target)
    end
  end
  count_event(queue, plan.event, #done)
  if plan.links.left <= 0 then drop_token(token) end
  return #done, plan.lost
end

-- Settle one token (settle.lua); see settle_plan.
local function settle_ids(token, record, mode, target, ids)
  local plan = settle_plan(token, record, mode, target, ids)
  for _, queue in ipairs(settle_prepare({plan})) do redis.call('ZREM', K_QUEUES, queue) end
  return settle_apply(plan)
end

-- Most entries the dead-letter journal keeps (approximately: XADD MAXLEN ~).
-- Entries leave it when a consumer reports them; this bounds a journal
-- nobody reads (dead letters of queues no Taskiq worker listens to).
local DEAD_LETTER_JOURNAL = 10000

-- Record in the dead-letter journal that `ids` (with delivery counts
-- `counts`) of `queue` went to `dead_letter_queue`. The caller checked the
-- journal's type before its first write.
local function journal_dead_letters(queue, dead_letter_queue, ids, counts)
  for i, id in ipairs(ids) do
    redis.call('XADD', K_DEAD_LETTERS, 'MAXLEN', '~', DEAD_LETTER_JOURNAL, '*',
      'queue', queue, 'dead_letter_queue', dead_letter_queue, 'id', id,
      'deliveries', counts[i])
  end
end

-- Return reserved `ids` of a token to pending, or to delayed until `due`
-- (server us). Only IDs still owned by `token` move, so a stale caller can
-- never release a newer reservation of the same message. `undeliver` takes
-- back the delivery count (the messages never reached a handler). A message
-- that used up the record's max deliveries goes to its dead-letter queue,
-- and an entry in the dead-letter journal says so.
-- The caller ran check_reservation_keys(). Returns the number moved.
-- `event` names what the moved ones are counted as ('released' unless given).
local function release_ids(token, record, ids, due, undeliver, event)
  local queue = record.q
  local max_deliveries = tonumber(record.m or '0') or 0
  local owned = held_ids(token, queue, ids)
  local counts = delivery_counts(owned)
  -- Which messages die is known before the first write, and so is whether
  -- the journal (not among the reservation keys) is written.
  local dies = {}
  if not undeliver and max_deliveries > 0 and record.x ~= '' then
    for i = 1, #owned do dies[i] = counts[i] >= max_deliveries end
    for i = 1, #owned do
      if dies[i] then
        check_keys({K_DEAD_LETTERS})
        break
      end
    end
  end
  local drop = {}
  for i, id in ipairs(ids) do drop[i] = token .. ' ' .. id end
  local moved, dead, dead_counts = {}, {}, {}
  for i, id in ipairs(owned) do
    local member = mem(queue, id)
    redis.call('ZREM', K_RESERVED, member)
    redis.call('HDEL', K_OWNERS, id)
    if undeliver and counts[i] > 0 then
      redis.call('HINCRBY', K_DELIVERIES, id, -1)
    end
    if dies[i] then
      dead[#dead + 1] = member
      dead_counts[#dead_counts + 1] = counts[i]
    else
      moved[#moved + 1] = member
    end
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
  if #dead > 0 then
    local renamed = {}
    for i, member in ipairs(dead) do renamed[i] = mem(record.x, mid(member)) end
    zadd_all(K_PENDING, renamed)
    register(record.x)
    unregister_if_empty(queue)
    journal_dead_letters(queue, record.x, ids_of(dead), dead_counts)
    count_event(queue, 'dead_lettered', #dead)
    wake(record.x)
  end
  if not redis.call('ZRANGE', K_TOKEN_IDS, token_lo(token), token_hi(token),
      'BYLEX', 'LIMIT', 0, 1)[1] then
    drop_token(token)
  end
  return #moved + #dead
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
-- `max_tokens` of them, optionally only those of `queue`). Age is qualified
-- in exact integer microseconds of server time, re-read from the token's own
-- record. A damaged token raises CORRUPT, unless `lenient` (the upkeep that
-- starts every claim), which skips it so one bad record cannot stop every
-- reader of the namespace; each token validates before it writes, so a
-- skipped token changed nothing. The types of every key are checked before
-- the first token is touched. Returns {IDs released, tokens, more left}.
local function recover_expired(now, queue, max_tokens, lenient)
  local tokens = redis.call('ZRANGE', K_LEASES, '-inf', '(' .. string.format('%.0f', now),
    'BYSCORE', 'LIMIT', 0, max_tokens)
  verified(K_LEASES)
  local released, recovered = 0, 0
  if #tokens > 0 then check_reservation_keys() end
  for _, token in ipairs(tokens) do
    local ok, got
    if lenient then
      ok, got = pcall(recover_token, token, now, queue)
    else
      ok, got = true, recover_token(token, now, queue)
    end
    if ok and got >= 0 then
      released = released + got
      recovered = recovered + 1
    end
  end
  local more = 0
  if #tokens == max_tokens then more = 1 end
  return {released, recovered, more}
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
