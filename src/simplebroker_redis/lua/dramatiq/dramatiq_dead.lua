-- dramatiq_dead.lua: Dramatiq's nack: move a reserved message to its
-- dead-letter queue (pending there, same ID) and record when it died, then
-- delete dead messages whose time to live (Dramatiq's dead_message_ttl) has
-- run out, in one step. Without a token it only expires (the broker's
-- heartbeat calls it so, now and then).
-- uses: guard, members, bulk, tokens, settling, upkeep, dramatiq, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the dead times (zset: "<dead-letter queue> <id>" -> server ms).
-- ARGV: 1 wake prefix, 2 reservation token ('' = dead-letter nothing),
--       3 the 19-digit ID, 4 dead-letter queue, 5 time to live in ms,
--       6 most dead messages to expire.
-- Returns: {settled, lost, expired}: settled and lost as in settle.lua;
-- expired counts the dead messages deleted. A dead message that is no longer
-- pending in its dead-letter queue (requeued, deleted, reserved) is not
-- deleted: its time entry is dropped (reserved: kept).
-- Raises (before any write): ARG (a malformed number, key list or a missing
-- dead-letter queue), WRONGTYPE.
dramatiq_key_count(1)
local times = KEYS[FIXED_KEYS + 1]
local token, id, dead = ARGV[2], ARGV[3], ARGV[4]
local ttl = dramatiq_count(ARGV[5], 'time to live')
local batch = dramatiq_count(ARGV[6], 'batch')
dramatiq_check_kind(times, 'zset')
local now_ms = math.floor(now_us() / 1000)

local plan, emptied = nil, {}
local settled, lost = 0, 0
if token ~= '' then
  if not id or not dead or dead == '' then fail('ARG', 'a dead-lettering needs an ID and a queue') end
  local record = read_record(token)
  if record then
    plan = settle_plan(token, record, 'move', dead, {id})
    emptied = settle_prepare({plan})
  else
    lost = 1
  end
end

-- The expiry's reads, before the first write.
local expired_members, gone, kept = {}, {}, {}
if batch > 0 then
  local due = redis.call('ZRANGE', times, '-inf', string.format('%.0f', now_ms - ttl), 'BYSCORE',
    'LIMIT', 0, batch)
  if #due > 0 then
    local pending = zmscore_all(K_PENDING, due)
    local reserved = zmscore_all(K_RESERVED, due)
    for i, member in ipairs(due) do
      if pending[i] then
        expired_members[#expired_members + 1] = member
      elseif not reserved[i] then
        gone[#gone + 1] = member
      end
    end
    check_keys({K_BODIES, K_DELIVERIES, K_QUEUES})
  end
end

if plan then
  settled, lost = settle_apply(plan)
  unregister_queues(emptied)
  if settled > 0 then redis.call('ZADD', times, now_ms, mem(dead, id)) end
end
local expired = 0
if #expired_members > 0 then
  expired = purge(K_PENDING, expired_members)
  zrem_all(times, expired_members)
  for _, queue in ipairs(queues_of(expired_members)) do unregister_if_empty(queue) end
end
if #gone > 0 then zrem_all(times, gone) end
return {settled, lost, expired}
