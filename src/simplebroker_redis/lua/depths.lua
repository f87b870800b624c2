-- depths.lua: a snapshot of a whole namespace for metrics and the dashboard:
-- every queue's depth per state and its oldest pending message, in one call
-- however many queues there are. Read only: a wrong-typed key fails the
-- read that meets it, and nothing is changed.
-- uses: members
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 cursor (queue name, exclusive; '' from the first),
--       3 most queues to read (0: all of them).
-- Returns: {server time µs, next cursor ('' when done), {dead-letter queues of live reservations},
--           {queue, pending, reserved, delayed, claimed, oldest pending id
--            ('' none), ...}, {worker id, record, ...},
--           {"<queue> <event>", count, ...} (the counters, every queue's)}.
-- Pending counts claimable messages only; reserved and delayed are their own.
local cursor, limit = ARGV[2], tonumber(ARGV[3])
local lo = '-'
if cursor ~= '' then lo = '(' .. cursor end
local queues
if limit > 0 then
  queues = redis.call('ZRANGE', K_QUEUES, lo, '+', 'BYLEX', 'LIMIT', 0, limit)
else
  queues = redis.call('ZRANGE', K_QUEUES, lo, '+', 'BYLEX')
end
-- Count each state of the page's queues. A set that holds few members in
-- the page's lex range (at most WALK_FACTOR per queue) is walked once,
-- member by member; a dense one is counted per queue (ZLEXCOUNT, O(log N)),
-- so the work is O(queues x log N) at worst and O(members) when sparse.
-- The first member met of a queue is its oldest (lex order is id order).
local WALK_FACTOR, WALK_CHUNK = 4, 5000
local counts, firsts = {}, {}
local lo_q, hi_q = '-', '-'
if #queues > 0 then lo_q, hi_q = qlo(queues[1]), qhi(queues[#queues]) end
for state, key in ipairs({K_PENDING, K_RESERVED, K_DELAYED, K_CLAIMED}) do
  local count, first = {}, {}
  counts[state], firsts[state] = count, first
  local total = 0
  if #queues > 0 then total = redis.call('ZLEXCOUNT', key, lo_q, hi_q) end
  if total > 0 and total <= WALK_FACTOR * #queues then
    local from = lo_q
    while true do
      local chunk = redis.call('ZRANGE', key, from, hi_q, 'BYLEX', 'LIMIT', 0, WALK_CHUNK)
      for _, member in ipairs(chunk) do
        local queue = mqueue(member)
        if count[queue] then
          count[queue] = count[queue] + 1
        else
          count[queue], first[queue] = 1, mid(member)
        end
      end
      if #chunk < WALK_CHUNK then break end
      from = '(' .. chunk[#chunk]
    end
  elseif total > 0 then
    for _, queue in ipairs(queues) do
      local n = redis.call('ZLEXCOUNT', key, qlo(queue), qhi(queue))
      if n > 0 and state == 1 then
        count[queue] = n
        first[queue] = mid(redis.call('ZRANGE', key, qlo(queue), qhi(queue), 'BYLEX', 'LIMIT', 0, 1)[1])
      elseif n > 0 then
        count[queue] = n
      end
    end
  end
end

local rows = {}
for _, queue in ipairs(queues) do
  rows[#rows + 1] = queue
  for state = 1, 4 do rows[#rows + 1] = counts[state][queue] or 0 end
  rows[#rows + 1] = firsts[1][queue] or ''
end
local next_cursor = ''
if limit > 0 and #queues == limit then next_cursor = queues[#queues] end
-- Dead-letter queues named by live reservations (one per reservation, so
-- bounded by what is in flight), for queues that are dead-letter targets
-- before anything was dead-lettered there.
local targets, seen = {}, {}
for _, raw in ipairs(redis.call('HVALS', K_TOKENS)) do
  local ok, record = pcall(cjson.decode, raw)
  if ok and type(record) == 'table' and type(record.x) == 'string' and record.x ~= ''
    and not seen[record.x] then
    seen[record.x] = true
    targets[#targets + 1] = record.x
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
return {string.format('%d', now), next_cursor, targets, rows,
  redis.call('HGETALL', K_WORKERS), redis.call('HGETALL', K_COUNTERS)}
