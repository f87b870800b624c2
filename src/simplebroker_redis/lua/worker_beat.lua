-- worker_beat.lua: a worker process announces itself (its heartbeat), or
-- leaves; records older than a time-to-live are dropped on the way, so a
-- killed worker disappears by itself.
-- uses: guard, time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 'beat' or 'leave', 3 worker id, 4 record (JSON,
--       for 'beat'), 5 time-to-live in µs of every record.
-- Returns: number of records kept.
-- Stored: workers[id] = "<server µs of the beat> <record>".
-- Raises (before any write): ARG for malformed arguments.
local mode, id, record, ttl = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if mode ~= 'beat' and mode ~= 'leave' then fail('ARG', 'worker_beat mode ' .. tostring(mode)) end
if not ttl or ttl <= 0 then fail('ARG', 'worker_beat time-to-live') end
local now = now_us()
local all = redis.call('HGETALL', K_WORKERS)
local stale = {}
for i = 1, #all, 2 do
  local beat = tonumber(string.match(all[i + 1], '^(%d+) '))
  if all[i] ~= id and (not beat or now - beat > ttl) then stale[#stale + 1] = all[i] end
end
if #stale > 0 then redis.call('HDEL', K_WORKERS, unpack(stale)) end
local kept = #all / 2 - #stale
if mode == 'leave' then
  if redis.call('HDEL', K_WORKERS, id) == 1 then kept = kept - 1 end
elseif redis.call('HSET', K_WORKERS, id, string.format('%d', now) .. ' ' .. record) == 1 then
  kept = kept + 1
end
return kept
