-- task_stats.lua: add what a process counted about tasks (per task name and
-- minute: enqueued, done, failed, retried, execution times; see
-- lib/taskstats.lua) to the namespace's task statistics, and drop minutes
-- older than the retention. Processes send it every few seconds
-- (simplebroker_redis.tasks.TaskStats), so its cost is shared by the tasks
-- counted meanwhile.
-- uses: guard, time, taskstats
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 retention in minutes, 3 most task names kept (a
--       new name past it is counted as '(other)'), then octets (minute since
--       the epoch (the process's clock), task name, enqueued, done, failed,
--       retried, sum of execution times µs, histogram "<first bucket>:<count>,...";
--       see lib/taskstats.lua).
-- Returns: the number of minute records written.
-- Raises (before any write): UNINITIALIZED/FOREIGN/SCHEMA, WRONGTYPE, ARG.
-- A minute after the server's current one counts as the current one (a
-- process clock ahead); one older than the retention goes to the totals only.
local retention, most = tonumber(ARGV[2]), tonumber(ARGV[3])
if not retention or retention < 1 or not most or most < 1 or (#ARGV - 3) % 8 ~= 0 then
  fail('ARG', 'task_stats takes a retention, a name limit, then octets')
end
namespace_meta()
check_keys({K_TASK_MINUTES, K_TASK_STATS, K_TASK_TOTALS})
local now = math.floor(now_us() / 60000000)
local oldest = now - retention
-- task_totals[''] counts the names kept (no task name is empty).
local names = tonumber(redis.call('HGET', K_TASK_TOTALS, '')) or 0
local admitted = {}
local written = 0
for i = 4, #ARGV, 8 do
  local name = ARGV[i + 1]
  local total = false  -- the name's totals record, read once (one name per octet, mostly)
  if admitted[name] == nil then
    total = redis.call('HGET', K_TASK_TOTALS, name)
    if total then
      admitted[name] = name
    elseif names < most then
      admitted[name], names = name, names + 1
      redis.call('HINCRBY', K_TASK_TOTALS, '', 1)
    else
      admitted[name], total = '(other)', nil
    end
  else
    total = nil
  end
  name = admitted[name]
  local delta = decode_task_record(table.concat({ARGV[i + 2], ARGV[i + 3], ARGV[i + 4],
    ARGV[i + 5], ARGV[i + 6]}, ',') .. ';' .. ARGV[i + 7])
  add_task_record(K_TASK_TOTALS, name, delta, total)
  local minute = math.min(tonumber(ARGV[i]) or now, now)
  if minute > oldest then
    local field = string.format('%d', minute) .. ' ' .. name
    add_task_record(K_TASK_STATS, field, delta)
    redis.call('ZADD', K_TASK_MINUTES, minute, field)
    written = written + 1
  end
end
local old = redis.call('ZRANGE', K_TASK_MINUTES, '-inf', string.format('%d', oldest), 'BYSCORE',
  'LIMIT', 0, 1000)
if #old > 0 then
  redis.call('HDEL', K_TASK_STATS, unpack(old))
  redis.call('ZREM', K_TASK_MINUTES, unpack(old))
end
return written
