-- lib/dead_lettering.lua: a released message that used up its deliveries
-- goes to its reservation's dead-letter queue, and the dead-letter journal
-- (the dead_letters stream consumers report from) says so.
-- uses: guard, members, bulk, counters

-- Most entries the dead-letter journal keeps (approximately: XADD MAXLEN ~).
-- Entries leave it when a consumer reports them; this bounds a journal
-- nobody reads (dead letters of queues no Taskiq worker listens to).
local DEAD_LETTER_JOURNAL = 10000

-- Which released messages (their delivery counts `counts`) die: a table
-- true at i for each that used up the `record`'s max deliveries, or nil
-- when none does. None dies without a dead-letter queue, nor when the
-- release takes the delivery back (`undeliver`). Reads only: when one dies
-- it checks the journal's type, which is not among the reservation keys.
local function dying(record, counts, undeliver)
  local max_deliveries = tonumber(record.m or '0') or 0
  if undeliver or max_deliveries <= 0 or record.x == '' then return nil end
  local dies = nil
  for i = 1, #counts do
    if counts[i] >= max_deliveries then
      dies = dies or {}
      dies[i] = true
    end
  end
  if dies then check_keys({K_DEAD_LETTERS}) end
  return dies
end

-- Move the messages of `owned` (IDs just taken out of reserved in `queue`,
-- delivery counts `counts`) that `dies` marks to the dead-letter queue
-- `target`, pending there, and journal each (writes only).
local function dead_letter(queue, target, owned, counts, dies)
  local ids, deliveries, renamed = {}, {}, {}
  for i, id in ipairs(owned) do
    if dies[i] then
      local n = #ids + 1
      ids[n], deliveries[n], renamed[n] = id, counts[i], mem(target, id)
    end
  end
  zadd_all(K_PENDING, renamed)
  register(target)
  unregister_if_empty(queue)
  for n, id in ipairs(ids) do
    redis.call('XADD', K_DEAD_LETTERS, 'MAXLEN', '~', DEAD_LETTER_JOURNAL, '*',
      'queue', queue, 'dead_letter_queue', target, 'id', id, 'deliveries', deliveries[n])
  end
  count_event(queue, 'dead_lettered', #ids)
  wake(target)
  return #ids
end
