-- lib/taskstats.lua: task records: what processes counted about one task
-- name (in one minute, or since the namespace began).
-- uses: (nothing but the prelude)
--
-- A record is the text "<enqueued>,<done>,<failed>,<retried>,<sum of
-- execution times µs>;<bucket>:<count>,...": four counters, then the
-- execution-time histogram, sparse (only buckets holding a run). Bucket b
-- holds runs of at most 100 µs x 2^(b/4) (simplebroker_redis.tasks.histogram
-- defines them; here they are only added up).

-- Decode a record (false or nil: an empty one).
local function decode_task_record(text)
  local record = {0, 0, 0, 0, 0, hist = {}}
  if not text then return record end
  local head, hist = string.match(text, '^([^;]*);?(.*)$')
  local i = 1
  for value in string.gmatch(head or '', '[^,]+') do
    if i <= 5 then record[i] = tonumber(value) or 0 end
    i = i + 1
  end
  for bucket, count in string.gmatch(hist or '', '(%d+):(%d+)') do
    local b = tonumber(bucket)
    record.hist[b] = (record.hist[b] or 0) + tonumber(count)
  end
  return record
end

local function encode_task_record(record)
  local buckets = {}
  for b in pairs(record.hist) do buckets[#buckets + 1] = b end
  table.sort(buckets)
  local parts = {}
  for i, b in ipairs(buckets) do parts[i] = string.format('%d:%.0f', b, record.hist[b]) end
  return string.format('%.0f,%.0f,%.0f,%.0f,%.0f', record[1], record[2], record[3], record[4],
    record[5]) .. ';' .. table.concat(parts, ',')
end

-- Add `delta` (a decoded record) to the record `field` of hash `key`.
local function add_task_record(key, field, delta)
  local record = decode_task_record(redis.call('HGET', key, field))
  for i = 1, 5 do record[i] = record[i] + delta[i] end
  for b, count in pairs(delta.hist) do record.hist[b] = (record.hist[b] or 0) + count end
  redis.call('HSET', key, field, encode_task_record(record))
end
