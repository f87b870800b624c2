-- rename.lua: retag every message of a queue with a new queue name (IDs
-- kept), optionally retargeting aliases, in one step.
-- uses: guard, members, bulk
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 old queue, 3 new queue, 4 '1' to retarget aliases,
--       5 new alias version (used only when an alias was retargeted).
-- Returns: {messages renamed, aliases retargeted}; {0, 0} when the old queue
-- does not exist.
-- Raises (before any write): EXISTS when the new queue exists, RESERVED when
-- the old queue has reserved messages.
local old, new = ARGV[2], ARGV[3]
namespace_meta()
check_keys({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_DUE, K_CLAIMED, K_ALIASES})
if has_rows(new) then fail('EXISTS', 'Target queue already exists') end
if first_in(K_RESERVED, old) then fail('RESERVED', 'queue ' .. old .. ' has reserved messages') end
if not has_rows(old) then return {0, 0} end

local renamed = 0
local pending_moved = false -- pending or delayed: the new queue's watchers are woken
for _, key in ipairs({K_PENDING, K_DELAYED, K_CLAIMED}) do
  local members = redis.call('ZRANGE', key, qlo(old), qhi(old), 'BYLEX')
  if #members > 0 then
    local moved = {}
    for i, member in ipairs(members) do moved[i] = mem(new, mid(member)) end
    if key == K_DELAYED then
      for i, member in ipairs(members) do
        local due = redis.call('ZSCORE', K_DUE, member)
        redis.call('ZREM', K_DUE, member)
        if due then redis.call('ZADD', K_DUE, due, moved[i]) end
      end
    end
    zrem_all(key, members)
    zadd_all(key, moved)
    renamed = renamed + #members
    if key ~= K_CLAIMED then pending_moved = true end
  end
end
redis.call('ZREM', K_QUEUES, old)
register(new)

local retargeted = 0
if ARGV[4] == '1' then
  local flat = redis.call('HGETALL', K_ALIASES)
  for i = 1, #flat, 2 do
    if flat[i + 1] == old then
      redis.call('HSET', K_ALIASES, flat[i], new)
      retargeted = retargeted + 1
    end
  end
  if retargeted > 0 then redis.call('HSET', K_META, 'alias_version', ARGV[5]) end
end
if pending_moved then wake(new) end
return {renamed, retargeted}
