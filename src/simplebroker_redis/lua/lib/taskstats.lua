-- lib/taskstats.lua: task records: what processes counted about one task
-- name (in one minute, or since the namespace began).
-- uses: (nothing but the prelude)
--
-- A record is the text "<enqueued>,<done>,<failed>,<retried>,<sum of
-- execution times µs>;<first bucket>:<count>,<count>,...": four counters,
-- then the execution-time histogram from its first non-empty bucket on, one
-- count per bucket ('' for none). Bucket b holds runs of at most 100 µs x
-- 2^(b/4) (simplebroker_redis.taskrecord defines them; here they are only
-- added up). Positional, so adding two records needs no sort and no
-- per-bucket formatting: in Redis's Lua that halves a send's time.

-- Decode a record (false or nil: an empty one).
local function decode_task_record(text)
  local record = {0, 0, 0, 0, 0, first = 0, hist = {}}
  if not text then return record end
  local head, first, hist = string.match(text, '^([^;]*);?(%d*):?(.*)$')
  local i = 1
  for value in string.gmatch(head or '', '[^,]+') do
    if i <= 5 then record[i] = tonumber(value) or 0 end
    i = i + 1
  end
  record.first = tonumber(first) or 0
  if hist and hist ~= '' then
    local counts, n = record.hist, 0
    for count in string.gmatch(hist .. ',', '(%d*),') do
      n = n + 1
      counts[n] = tonumber(count) or 0
    end
  end
  return record
end

local function encode_task_record(record)
  local parts, counts = {}, record.hist
  local last = #counts
  while last > 0 and counts[last] == 0 do last = last - 1 end
  for i = 1, last do
    if counts[i] ~= 0 then parts[i] = string.format('%d', counts[i]) else parts[i] = '' end
  end
  local head = string.format('%.0f,%.0f,%.0f,%.0f,%.0f;', record[1], record[2], record[3],
    record[4], record[5])
  if last == 0 then return head end
  return head .. string.format('%d', record.first) .. ':' .. table.concat(parts, ',')
end

-- Add `delta` (a decoded record) to the record `field` of hash `key`, whose
-- stored text is `text` when the caller read it already (else it is read).
local function add_task_record(key, field, delta, text)
  if text == nil then text = redis.call('HGET', key, field) end
  local record = decode_task_record(text)
  for i = 1, 5 do record[i] = record[i] + delta[i] end
  local add = delta.hist
  if #add > 0 then
    local counts, size = record.hist, #record.hist
    if size == 0 then record.first = delta.first end
    local shift = record.first - delta.first
    if shift > 0 then  -- the delta starts lower: move the stored counts up
      for i = size, 1, -1 do counts[i + shift] = counts[i] end
      for i = 1, shift do counts[i] = 0 end
      record.first, size, shift = delta.first, size + shift, 0
    end
    -- Delta bucket i is stored at i - shift (shift <= 0 here); fill any gap first.
    local top = #add - shift
    for i = size + 1, top do counts[i] = 0 end
    for i = 1, #add do counts[i - shift] = counts[i - shift] + add[i] end
  end
  redis.call('HSET', key, field, encode_task_record(record))
end
