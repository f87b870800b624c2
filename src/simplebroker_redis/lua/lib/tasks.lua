-- lib/tasks.lua: the task index: which message carries a framework's task.
-- uses: (nothing but the prelude)
--
-- tasks["k:<key>"] = "<id> <queue>": the newest message written under the
-- key (a task sent again, a retry say, moves its key to the new message)
-- and the queue it was written to; tasks["i:<id>"] = "<key>", so that the
-- scripts that delete a message drop its entries and the index holds
-- exactly the messages that exist. A key is "<framework>:<task id>"
-- (simplebroker_redis.tasks.index_key); the caller of a write names it.
-- A message moved to another queue (dead-lettered, requeued) keeps its
-- entry: task_find.lua is told which other queues to look in. Every command
-- runs with redis.pcall, as the counters do: a damaged index stops
-- indexing and never fails the operation that carries it, so it needs no
-- type check and may follow any write.

local INDEX_CHUNK = 1000

-- Index message `id`, just written to `queue`, under `key` ('' for none).
local function index_task(key, id, queue)
  if key ~= '' then
    redis.pcall('HSET', K_TASKS, 'k:' .. key, id .. ' ' .. queue, 'i:' .. id, key)
  end
end

-- Index several messages: `entries` is {{key, id, queue}, ...} ('' keys are
-- skipped), in as few HSETs as the chunking allows (a group commit's batch).
local function index_tasks(entries)
  local fields = {}
  for _, entry in ipairs(entries) do
    local key, id = entry[1], entry[2]
    if key ~= '' then
      fields[#fields + 1] = 'k:' .. key
      fields[#fields + 1] = id .. ' ' .. entry[3]
      fields[#fields + 1] = 'i:' .. id
      fields[#fields + 1] = key
    end
  end
  for i = 1, #fields, 4 * INDEX_CHUNK do
    redis.pcall('HSET', K_TASKS, unpack(fields, i, math.min(i + 4 * INDEX_CHUNK - 1, #fields)))
  end
end

-- The entries to drop for the deleted messages whose fields are `fields`
-- ("i:<id>"), given their `keys` (HMGET's answer): each one's own, and its
-- key's unless the key moved on to a newer message.
local function stale_entries(fields, keys)
  local drop, named, ids = {}, {}, {}
  for j = 1, #fields do
    if keys[j] then
      drop[#drop + 1] = fields[j]
      named[#named + 1] = 'k:' .. keys[j]
      ids[#ids + 1] = string.sub(fields[j], 3)
    end
  end
  if #named == 0 then return drop end
  local current = redis.pcall('HMGET', K_TASKS, unpack(named))
  if type(current) ~= 'table' or current.err then return drop end
  for n = 1, #named do
    if current[n] and string.sub(current[n], 1, ID_WIDTH) == ids[n] then
      drop[#drop + 1] = named[n]
    end
  end
  return drop
end

-- Drop the index entries of one deleted message (the common case: a worker
-- acknowledging its task): one HGET when it was not indexed, three commands
-- and no table when it was.
local function forget_task(id)
  local field = 'i:' .. id
  local key = redis.pcall('HGET', K_TASKS, field)
  if type(key) ~= 'string' then return end
  local current = redis.pcall('HGET', K_TASKS, 'k:' .. key)
  if type(current) == 'string' and string.sub(current, 1, ID_WIDTH) == id then
    redis.pcall('HDEL', K_TASKS, field, 'k:' .. key)
  else
    redis.pcall('HDEL', K_TASKS, field)
  end
end

-- Drop the index entries of deleted messages `ids`: one HMGET when none of
-- them was indexed.
local function forget_tasks(ids)
  if #ids == 1 then return forget_task(ids[1]) end
  for i = 1, #ids, INDEX_CHUNK do
    local fields = {}
    for j = i, math.min(i + INDEX_CHUNK - 1, #ids) do fields[#fields + 1] = 'i:' .. ids[j] end
    local keys = redis.pcall('HMGET', K_TASKS, unpack(fields))
    if type(keys) == 'table' and not keys.err then
      local drop = stale_entries(fields, keys)
      if #drop > 0 then redis.pcall('HDEL', K_TASKS, unpack(drop)) end
    end
  end
end
