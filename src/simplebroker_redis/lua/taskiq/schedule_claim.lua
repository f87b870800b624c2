-- schedule_claim.lua: claim one due run of a Taskiq schedule, so that of any
-- number of schedulers exactly one sends it. A claimed run waits in
-- schedule_claims (with a lease) until schedule_sent.lua confirms it was
-- sent; once its lease expired it may be claimed again ('retry'), so a
-- scheduler dying between claim and send loses no run.
-- uses: guard, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 schedule id, 3 kind: 'time' (a one-off: the claim
--       removes the schedule), 'cron' (one run per minute), 'interval' (one
--       run per interval) or 'retry' (a claimed run whose lease expired),
--       4 cron: the run's minute (minutes since the epoch, UTC); interval:
--       the interval in us; retry: the run to claim again; time: '',
--       5 claim lease in us.
-- Returns: {run} when this call claimed it (the run's name: 'once', the
--          minute, or the server time of an interval claim in us); {} when
--          the run is not this caller's (claimed already, or the schedule
--          is gone).
-- Raises (before any write): ARG for a malformed kind, run or lease;
--        UNINITIALIZED/FOREIGN/SCHEMA; CORRUPT for a damaged claim record.
local id, kind, run, lease = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if not lease or lease <= 0 then fail('ARG', 'claim lease ' .. tostring(ARGV[5])) end
if kind ~= 'time' and kind ~= 'cron' and kind ~= 'interval' and kind ~= 'retry' then
  fail('ARG', 'schedule kind ' .. tostring(kind))
end
if (kind == 'cron' or kind == 'interval') and not string.find(run, '^%d+$')
    or kind == 'retry' and not string.find(run, '^%S+$') then
  fail('ARG', 'run ' .. tostring(run))
end
namespace_meta()
local now = now_us()
local deadline = string.format('%.0f', now + lease)

if kind == 'retry' then
  local field = id .. ' ' .. run
  local raw = redis.call('HGET', K_SCHEDULE_CLAIMS, field)
  if not raw then return {} end
  local ok, record = pcall(cjson.decode, raw)
  if not ok or type(record) ~= 'table' or type(record.s) ~= 'string' or not tonumber(record.d) then
    fail('CORRUPT', 'schedule claim ' .. field .. ' has a damaged record')
  end
  if tonumber(record.d) >= now then return {} end
  record.d = deadline
  redis.call('HSET', K_SCHEDULE_CLAIMS, field, cjson.encode(record))
  return {run}
end

-- Reads first (each also refuses a wrong-typed key).
local stored = redis.call('HGET', K_SCHEDULES, id)
if not stored then return {} end
local last
if kind ~= 'time' then last = redis.call('HGET', K_SCHEDULE_RUNS, id) end
check_keys({K_SCHEDULE_CLAIMS})
if kind == 'cron' then
  -- One run per minute: a minute at or before the last claimed one is taken.
  local minute = last and tonumber(string.match(last, '^cron:(%d+)$'))
  if minute and minute >= tonumber(run) then return {} end
  redis.call('HSET', K_SCHEDULE_RUNS, id, 'cron:' .. run)
elseif kind == 'interval' then
  -- One run per interval by the server clock; half a second of slack, as
  -- schedulers look once a second.
  local at = last and tonumber(string.match(last, '^interval:(%d+)$'))
  if at and now - at < tonumber(run) - 500000 then return {} end
  run = string.format('%.0f', now)
  redis.call('HSET', K_SCHEDULE_RUNS, id, 'interval:' .. run)
else
  run = 'once'
  redis.call('HDEL', K_SCHEDULES, id)
end
redis.call('HSET', K_SCHEDULE_CLAIMS, id .. ' ' .. run,
  cjson.encode({s = stored, d = deadline, t = string.format('%.0f', now)}))
return {run}
