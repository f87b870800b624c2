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

-- HMGET of hash `key`, or with `zset` ZMSCORE of sorted set `key`, for
-- many items, chunked; an item not there is false. The first chunk's reply
-- starts the answer (usually it is all of it: nothing to copy). The
-- command is a literal in each branch, where the key checker
-- (tests/faults/luakeys.py) reads it.
local function read_many(key, items, zset)
  local out = {}
  for i = 1, #items, CHUNK do
    local last = math.min(i + CHUNK - 1, #items)
    local got
    if zset then
      got = redis.call('ZMSCORE', key, unpack(items, i, last))
    else
      got = redis.call('HMGET', key, unpack(items, i, last))
    end
    if i == 1 then
      out = got
    else
      for j = 1, #got do out[#out + 1] = got[j] end
    end
  end
  if #items > 0 then verified(key) end
  return out
end

-- HMGET of many fields, chunked; missing fields are false.
local function hmget_all(key, fields) return read_many(key, fields, false) end

-- ZMSCORE of many members, chunked; members not in the set are false.
local function zmscore_all(key, members) return read_many(key, members, true) end

local function ids_of(members)
  local ids = {}
  for i = 1, #members do ids[i] = mid(members[i]) end
  return ids
end

-- The IDs and bodies of `members`, in order; raises CORRUPT for a message
-- without a body.
local function bodies_of(members)
  local ids = ids_of(members)
  local bodies = hmget_all(K_BODIES, ids)
  for j = 1, #ids do
    if not bodies[j] then fail('CORRUPT', 'message ' .. ids[j] .. ' has no body') end
  end
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

-- The flat reply {id1, body1, id2, body2, ...}.
local function id_body_pairs(ids, bodies)
  local out = {}
  for i = 1, #ids do
    out[2 * i - 1] = ids[i]
    out[2 * i] = bodies[i]
  end
  return out
end
