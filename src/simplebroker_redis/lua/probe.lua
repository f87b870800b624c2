-- probe.lua: cheap read-only questions about one queue.
-- uses: members
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 question: 'pending' (any pending message with id
--       above ARGV[4] when given), 'latest' (newest pending id), 'exists' (any
--       message at all, claimed included); 3 queue, 4 after ('' none).
-- Returns: 1/0 for 'pending' and 'exists'; a 19-digit id or false for
--          'latest'.
local question, queue = ARGV[2], ARGV[3]
local sources = {K_PENDING, K_RESERVED, K_DELAYED}
if question == 'exists' then
  if has_rows(queue) then return 1 end
  return 0
elseif question == 'pending' then
  local lo, hi = bounds(queue, ARGV[4], '')
  for _, key in ipairs(sources) do
    if redis.call('ZRANGE', key, lo, hi, 'BYLEX', 'LIMIT', 0, 1)[1] then return 1 end
  end
  return 0
end
local best = false
for _, key in ipairs(sources) do
  local newest = redis.call('ZRANGE', key, qhi(queue), qlo(queue), 'BYLEX', 'REV', 'LIMIT', 0, 1)[1]
  if newest and (not best or mid(newest) > best) then best = mid(newest) end
end
return best
