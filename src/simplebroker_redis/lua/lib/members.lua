-- lib/members.lua: sorted-set members, lex ranges, the queue registry, wake-ups.
-- uses: (nothing but the prelude)
--
-- Members of the lex-ordered sets are "<queue> <ID_WIDTH-digit id>"; the
-- members of one queue are the range ["q ", "q!").

local function mem(queue, id) return queue .. ' ' .. id end
local function mid(member) return string.sub(member, -ID_WIDTH) end
local function mqueue(member) return string.sub(member, 1, -ID_WIDTH - 2) end
local function qlo(queue) return '[' .. queue .. ' ' end
local function qhi(queue) return '(' .. queue .. '!' end

-- Lex bounds of a queue, optionally restricted to after < id < before.
local function bounds(queue, after, before)
  local lo = qlo(queue)
  local hi = qhi(queue)
  if after ~= '' then lo = '(' .. queue .. ' ' .. after end
  if before ~= '' then hi = '(' .. queue .. ' ' .. before end
  return lo, hi
end

local function range(key, lo, hi, order, limit)
  if order == 'newest' then
    return redis.call('ZRANGE', key, hi, lo, 'BYLEX', 'REV', 'LIMIT', 0, limit)
  end
  return redis.call('ZRANGE', key, lo, hi, 'BYLEX', 'LIMIT', 0, limit)
end

-- Merge several member lists of one queue, each sorted in `order`, keeping
-- the first `limit`; returns merged members and the index of the list each
-- came from (nil when they all come from the one list that holds anything:
-- then the members are that list itself, cut to `limit`).
local function merge(lists, order, limit)
  local only = nil
  for i = 1, #lists do
    if lists[i][1] then
      if only then only = false break end
      only = i
    end
  end
  if only ~= false then
    local list = lists[only or 1] or {}
    for j = #list, limit + 1, -1 do list[j] = nil end
    return list, nil, only
  end
  local out, src = {}, {}
  local pos = {}
  for i = 1, #lists do pos[i] = 1 end
  while #out < limit do
    local best, best_i = nil, nil
    for i = 1, #lists do
      local candidate = lists[i][pos[i]]
      if candidate then
        local id = mid(candidate)
        if best == nil or (order == 'newest' and id > best) or (order ~= 'newest' and id < best) then
          best, best_i = id, i
        end
      end
    end
    if best_i == nil then break end
    out[#out + 1] = lists[best_i][pos[best_i]]
    src[#src + 1] = best_i
    pos[best_i] = pos[best_i] + 1
  end
  return out, src
end

local function first_in(key, queue)
  return redis.call('ZRANGE', key, qlo(queue), qhi(queue), 'BYLEX', 'LIMIT', 0, 1)[1]
end

local function lexcount(key, queue)
  return redis.call('ZLEXCOUNT', key, qlo(queue), qhi(queue))
end

-- A queue exists while it holds a message in any state.
local function has_rows(queue)
  return first_in(K_PENDING, queue) or first_in(K_RESERVED, queue)
    or first_in(K_DELAYED, queue) or first_in(K_CLAIMED, queue)
end

local function register(queue) redis.call('ZADD', K_QUEUES, 0, queue) end

local function unregister_if_empty(queue)
  if not has_rows(queue) then redis.call('ZREM', K_QUEUES, queue) end
end

-- Sharded Pub/Sub: the channel carries the namespace's hash tag, so in a
-- cluster it lives on this node (the script's slot) and reaches only its
-- subscribers there.
local function wake(queue) redis.call('SPUBLISH', WAKE_PREFIX .. queue, '1') end
