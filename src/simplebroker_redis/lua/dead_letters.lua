-- dead_letters.lua: read the dead-letter journal: entries after a cursor
-- whose source queue is one of the given queues, with each message's body.
-- Read only: a wrong-typed journal fails the read that meets it.
-- uses: (nothing but the prelude)
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 cursor (journal entry ID, exclusive; '0-0' from the
--       start), 3 most entries to scan, 4.. source queues to return.
-- Returns: {last entry ID scanned ('' when none), 1 if more entries may
--          follow else 0, then per matching entry: entry ID, queue,
--          dead-letter queue, 19-digit message id, deliveries, body (nil
--          when the message is gone)}.
local limit = tonumber(ARGV[3])
local wanted = {}
for i = 4, #ARGV do wanted[ARGV[i]] = true end
local entries = redis.call('XRANGE', K_DEAD_LETTERS, '(' .. ARGV[2], '+', 'COUNT', limit)
local out = {'', 0}
if #entries == 0 then return out end
out[1] = entries[#entries][1]
if #entries == limit then out[2] = 1 end
for _, entry in ipairs(entries) do
  local fields = {}
  local list = entry[2]
  for i = 1, #list, 2 do fields[list[i]] = list[i + 1] end
  if fields.queue and wanted[fields.queue] then
    out[#out + 1] = entry[1]
    out[#out + 1] = fields.queue
    out[#out + 1] = fields.dead_letter_queue or ''
    out[#out + 1] = fields.id or ''
    out[#out + 1] = fields.deliveries or '0'
    out[#out + 1] = fields.id and redis.call('HGET', K_BODIES, fields.id) or false
  end
end
return out
