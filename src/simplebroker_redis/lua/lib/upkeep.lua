-- lib/upkeep.lua: promoting due delayed messages, vacuum of claimed messages,
-- and the opportunistic upkeep and maintenance that ride on other scripts.
-- uses: members, bulk, reservations, time

-- Make delayed messages whose due time has passed claimable again.
local function promote_due(now, limit)
  local members = redis.call('ZRANGE', K_DUE, '-inf', string.format('%.0f', now), 'BYSCORE', 'LIMIT', 0, limit)
  if #members == 0 then return 0 end
  zrem_all(K_DUE, members)
  zrem_all(K_DELAYED, members)
  zadd_all(K_PENDING, members)
  for _, queue in ipairs(queues_of(members)) do wake(queue) end
  return #members
end

-- Delete messages (members of `key`) of one queue: bodies and delivery counts
-- go with them. Caller checks reservations first.
local function purge(key, members)
  if #members == 0 then return 0 end
  local ids = ids_of(members)
  zrem_all(key, members)
  hdel_all(K_BODIES, ids)
  hdel_all(K_DELIVERIES, ids)
  if key == K_DELAYED then zrem_all(K_DUE, members) end
  return #members
end

-- Remove up to `batch` claimed messages (oldest queue names first).
local function purge_claimed(batch)
  local members = redis.call('ZRANGE', K_CLAIMED, 0, batch - 1)
  local removed = purge(K_CLAIMED, members)
  for _, queue in ipairs(queues_of(members)) do unregister_if_empty(queue) end
  return removed
end

-- Automatic maintenance, asked for by the client every AUTO_VACUUM_INTERVAL
-- committed messages (SimpleBroker's MaintenanceSchedule) and carried by the
-- next write, claim or reservation instead of costing round trips of its
-- own. `spec` is '' (not due) or '<batch>:<threshold fraction>:<limit>': when
-- vacuum is eligible (claimed >= total * threshold, or more than `limit`
-- claimed), up to `batch` claimed messages are removed. Expired
-- reservations are recovered too. Best effort: a failure changes nothing
-- for the operation that carries it.
local function vacuum_step(spec)
  local batch, threshold, limit = string.match(spec, '^(%d+):([%d.]+):(%d+)$')
  if not batch then return end
  recover_expired(now_us(), '', 16, true)
  local claimed = redis.call('ZCARD', K_CLAIMED)
  local total = claimed + redis.call('ZCARD', K_PENDING) + redis.call('ZCARD', K_RESERVED)
    + redis.call('ZCARD', K_DELAYED)
  if total > 0 and (claimed >= total * tonumber(threshold) or claimed > tonumber(limit)) then
    purge_claimed(tonumber(batch))
  end
end

local function maintain(spec)
  if spec and spec ~= '' then pcall(vacuum_step, spec) end
end

-- Opportunistic upkeep run at the start of every claim or reservation:
-- releases up to 16 expired reservations and promotes up to 256 due
-- delayed messages, each a complete transition of its own.
local function upkeep()
  local now = now_us()
  recover_expired(now, '', 16, true)
  promote_due(now, 256)
  return now
end
