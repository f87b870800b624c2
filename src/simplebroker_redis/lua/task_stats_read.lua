-- task_stats_read.lua: the task statistics of some minutes (every task
-- name's minute records, lib/taskstats.lua), and optionally every name's
-- totals. Read only.
-- uses: bulk
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 first minute, 3 last minute (minutes since the
--       epoch), 4 '1' to add the totals.
-- Returns: {server time µs, {"<minute> <name>", record, ...} in minute
-- order, {name, record, ...} (empty without totals)}.
local fields = redis.call('ZRANGE', K_TASK_MINUTES, ARGV[2], ARGV[3], 'BYSCORE')
local minutes = {}
if #fields > 0 then
  local records = hmget_all(K_TASK_STATS, fields)
  for i, field in ipairs(fields) do
    if records[i] then
      minutes[#minutes + 1] = field
      minutes[#minutes + 1] = records[i]
    end
  end
end
local totals = {}
if ARGV[4] == '1' then totals = redis.call('HGETALL', K_TASK_TOTALS) end
local t = redis.call('TIME')
return {t[1] .. string.format('%06d', tonumber(t[2])), minutes, totals}
