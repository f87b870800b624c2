-- claim.lua: exactly-once claim (pending -> claimed) or move (-> target queue)
-- of up to `limit` messages of one queue, in one step.
-- uses: guard, members, bulk, upkeep, counters
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue, 3 op ('claim'|'move'), 4 target ('' unless
--       move), 5 limit, 6 order ('oldest'|'newest'), 7 after ('' or 19
--       digits, exclusive), 8 before ('' or 19 digits, exclusive), 9 exact
--       ('' or 19 digits; overrides the bounds), 10 '1' to let a move select
--       claimed messages too (they stay claimed in the target), 11 maintenance
--       spec ('' when not due; see maintain() in lib/upkeep.lua).
-- Returns: flat {id1, body1, id2, body2, ...} in selection order.
-- Side effect first: upkeep() releases expired reservations and promotes due
-- delayed messages (each a complete transition of its own).
-- Raises (before any write): WRONGTYPE for a key of the wrong type; CORRUPT
--         for damaged data.
local queue, op, target = ARGV[2], ARGV[3], ARGV[4]
local limit, order = tonumber(ARGV[5]), ARGV[6]
local after, before, exact = ARGV[7], ARGV[8], ARGV[9]
local with_claimed = ARGV[10] == '1'
upkeep()

local lists
if exact ~= '' then
  local member = mem(queue, exact)
  lists = {{}, {}}
  if redis.call('ZSCORE', K_PENDING, member) then
    lists[1] = {member}
  elseif with_claimed and redis.call('ZSCORE', K_CLAIMED, member) then
    lists[2] = {member}
  end
else
  local lo, hi = bounds(queue, after, before)
  lists = {range(K_PENDING, lo, hi, order, limit), {}}
  if with_claimed then lists[2] = range(K_CLAIMED, lo, hi, order, limit) end
end
local members, src, only = merge(lists, order, limit)
if #members == 0 then
  maintain(ARGV[11])
  return {}
end
local ids, bodies = bodies_of(members)
-- A move writes keys it has not read: refuse them here if wrong-typed. (A
-- claim's first write, to claimed, refuses a wrong-typed claimed itself.)
if op == 'move' then check_keys({K_QUEUES, K_RESERVED, K_DELAYED, K_CLAIMED}) end

local from_pending, from_claimed = {}, {}
if not src then
  if only == 1 then from_pending = members else from_claimed = members end
else
  for i, member in ipairs(members) do
    if src[i] == 1 then from_pending[#from_pending + 1] = member
    else from_claimed[#from_claimed + 1] = member end
  end
end
if op == 'claim' then
  zadd_all(K_CLAIMED, from_pending)
  zrem_all(K_PENDING, from_pending)
  count_event(queue, 'acknowledged', #from_pending)
else
  zrem_all(K_PENDING, from_pending)
  zrem_all(K_CLAIMED, from_claimed)
  local moved_pending, moved_claimed = {}, {}
  for _, member in ipairs(from_pending) do moved_pending[#moved_pending + 1] = mem(target, mid(member)) end
  for _, member in ipairs(from_claimed) do moved_claimed[#moved_claimed + 1] = mem(target, mid(member)) end
  zadd_all(K_PENDING, moved_pending)
  zadd_all(K_CLAIMED, moved_claimed)
  register(target)
  unregister_if_empty(queue)
  if #moved_pending > 0 then wake(target) end
end

maintain(ARGV[11])
return id_body_pairs(ids, bodies)
