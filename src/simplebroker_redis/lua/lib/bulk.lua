-- lib/bulk.lua: commands over many members, chunked below Lua's unpack limit.
-- uses: guard, members

local CHUNK = 1000

local function zadd_all(key, members)
  for i = 1, #members, CHUNK do
    local args, n = {}, 0
    for j = i, math.min(i + CHUNK - 1, #members) do
      args[n + 1] = 0
      args[n + 2] = members[j]
      n = n + 2
    end
    redis.call('ZADD', key, unpack(args))
  end
end

-- ZREM of many members, chunked; returns how many were removed.
local function zrem_all(key, members)
  local removed = 0
  for i = 1, #members, CHUNK do
    removed = removed + redis.call('ZREM', key, unpack(members, i, math.min(i + CHUNK - 1, #members)))
  end
  return removed
end

-- HSET of a flat {field1, value1, field2, value2, ...} list, chunked.
local function hset_all(key, pairs_list)
  for i = 1, #pairs_list, 2 * CHUNK do
    redis.call('HSET', key, unpack(pairs_list, i, math.min(i + 2 * CHUNK - 1, #pairs_list)))
  end
end

local function hdel_all(key, fields)
  for i = 1, #fields, CHUNK do
    redis.call('HDEL', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
  end
end

-- The IDs and bodies of `members`, in order; raises CORRUPT for a message
-- without a body.
local function bodies_of(members)
  local ids, bodies = {}, {}
  for j = 1, #members do ids[j] = mid(members[j]) end
  for i = 1, #ids, CHUNK do
    local got = redis.call('HMGET', K_BODIES, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
    for j = 1, #got do
      if not got[j] then fail('CORRUPT', 'message ' .. ids[i + j - 1] .. ' has no body') end
      bodies[i + j - 1] = got[j]
    end
  end
  if #ids > 0 then verified(K_BODIES) end
  return ids, bodies
end

-- The distinct queues of a member list, in first-seen order.
local function queues_of(members)
  local out, seen = {}, {}
  for _, member in ipairs(members) do
    local queue = mqueue(member)
    if not seen[queue] then
      seen[queue] = true
      out[#out + 1] = queue
    end
  end
  return out
end

local function ids_of(members)
  local ids = {}
  for i = 1, #members do ids[i] = mid(members[i]) end
  return ids
end

-- The flat reply {id1, body1, id2, body2, ...}.
local function id_body_pairs(ids, bodies)
  local out = {}
  for i = 1, #ids do
    out[2 * i - 1] = ids[i]
    out[2 * i] = bodies[i]
  end
  return out
end

-- The replies of `read(...)`, one read of `key` per chunk of `items` (its
-- arguments), concatenated; `key` is verified once read. The command stays
-- a literal in each caller, where the key checker (tests/faults) sees it.
local function read_chunked(key, items, read)
  local out = {}
  for i = 1, #items, CHUNK do
    local got = read(unpack(items, i, math.min(i + CHUNK - 1, #items)))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  if #items > 0 then verified(key) end
  return out
end

-- HMGET of many fields, chunked; missing fields are false.
local function hmget_all(key, fields)
  return read_chunked(key, fields, function(...) return redis.call('HMGET', key, ...) end)
end

-- ZMSCORE of many members, chunked; members not in the set are false.
local function zmscore_all(key, members)
  return read_chunked(key, members, function(...) return redis.call('ZMSCORE', key, ...) end)
end
