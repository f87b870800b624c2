-- lib/settling.lua: finishing reserved messages of a token: 'claim' marks
-- them consumed, 'delete' removes them, 'move' makes them pending in a
-- target queue.
-- uses: guard, members, bulk, counters, tokens, tasks
--
-- A settlement is planned first (every read, which also refuses a
-- wrong-typed key), then prepared (the type checks of keys written unread,
-- over every plan of the call), and applied last (writes only), so a script
-- that settles several tokens validates all of them before its first write.

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

-- Whether `queue` still holds a message once `leaving` of its reserved
-- messages are gone (reads only; call before the writes). Reserved first:
-- a consumer settling one message usually holds others of the queue.
local function keeps_rows(queue, leaving)
  return lexcount(K_RESERVED, queue) > leaving or first_in(K_PENDING, queue)
    or first_in(K_DELAYED, queue) or first_in(K_CLAIMED, queue)
end

-- Plan the settlement of `ids` of a token whose `record` was read (reads
-- only). IDs the token no longer holds are lost.
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
-- unregister (unregister_queues, after the plans are applied or before).
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

-- Take the queues settle_prepare found emptied out of the registry (writes only).
local function unregister_queues(emptied)
  for _, queue in ipairs(emptied) do redis.call('ZREM', K_QUEUES, queue) end
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
      forget_tasks(done)
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
  unregister_queues(settle_prepare({plan}))
  return settle_apply(plan)
end
