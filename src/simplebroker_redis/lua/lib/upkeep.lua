-- lib/upkeep.lua: promoting due delayed messages, vacuum of claimed messages,
-- and the opportunistic upkeep and maintenance that ride on other scripts.
-- uses: guard, members, bulk, tokens, releasing, time, tasks

-- Make delayed messages whose due time has passed claimable again (up to
-- `limit`). Returns the due time (server us, a string) of the next delayed
-- message still waiting, or false when none waits. One read when nothing is
-- due.
local function promote_due(now, limit)
  local first = redis.call('ZRANGE', K_DUE, 0, 0, 'WITHSCORES')
  if not first[2] or tonumber(first[2]) > now then return first[2] or false end
  local members = redis.call('ZRANGE', K_DUE, '-inf', string.format('%.0f', now), 'BYSCORE',
    'LIMIT', 0, limit)
  check_keys({K_PENDING, K_DELAYED})
  zrem_all(K_DUE, members)
  zrem_all(K_DELAYED, members)
  zadd_all(K_PENDING, members)
  for _, queue in ipairs(queues_of(members)) do wake(queue) end
  return redis.call('ZRANGE', K_DUE, 0, 0, 'WITHSCORES')[2] or false
end

-- Delete messages (members of `key`) of one queue: bodies and delivery counts
-- go with them. The caller checked reservations and key types first.
local function purge(key, members)
  if #members == 0 then return 0 end
  local ids = ids_of(members)
  zrem_all(key, members)
  hdel_all(K_BODIES, ids)
  hdel_all(K_DELIVERIES, ids)
  forget_tasks(ids)
  if key == K_DELAYED then zrem_all(K_DUE, members) end
  return #members
end

-- Remove up to `batch` claimed messages (oldest queue names first). The
-- caller checked key types first.
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
  check_reservation_keys()
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
-- delayed messages, each a complete transition of its own. Three reads when
-- there is nothing to do. `holder` (optional): the reserving worker's own
-- tokens ('<holder>.<random>') are left alone: their expiry only means the
-- worker's renewal has not arrived yet (a reservation held up by the
-- network reaches the server first after a partition); the worker renews
-- them, and its heartbeat's recovery hands back any it gave up. Returns the
-- server time (us) and the due time of the next delayed message still
-- waiting (false when none).
local function upkeep(holder)
  local now = now_us()
  local spare = nil
  if holder then spare = {holder = holder} end
  recover_expired(now, '', 16, true, spare)
  return now, promote_due(now, 256)
end
