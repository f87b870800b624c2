-- lib/counters.lua: message counters kept by the scripts themselves.
-- uses: (nothing but the prelude)
--
-- counters["<queue> <event>"] counts messages per queue and event:
-- enqueued, delivered, acknowledged, released, recovered, dead_lettered.
-- One HINCRBY in the script that already runs, so the counts are right
-- across every process and machine and cost no round trip. It runs with
-- redis.pcall: a damaged counter (a wrong-typed key, a field that is not
-- an integer) stops counting instead of failing the operation, so the
-- call needs no type check of its own and may come after any write.

local function count_event(queue, event, n)
  if n > 0 then redis.pcall('HINCRBY', K_COUNTERS, queue .. ' ' .. event, n) end
end

-- Count `event` once per message of `members` ("<queue> <id>"), per queue.
local function count_members(members, event)
  local per, order = {}, {}
  for _, member in ipairs(members) do
    local queue = string.sub(member, 1, -ID_WIDTH - 2)
    if not per[queue] then
      per[queue] = 0
      order[#order + 1] = queue
    end
    per[queue] = per[queue] + 1
  end
  for _, queue in ipairs(order) do count_event(queue, event, per[queue]) end
end
