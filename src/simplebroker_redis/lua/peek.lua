-- peek.lua: read messages of one queue without changing anything.
-- Reserved and delayed messages are pending (not yet consumed) and are shown;
-- claimed messages only with include_claimed. Read only: a wrong-typed key
-- fails the read that meets it.
-- uses: members, bulk
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue, 3 limit, 4 order, 5 after, 6 before, 7 exact,
--       8 '1' to include claimed messages.
-- Returns: flat {id1, body1, ...} in order.
-- Raises: CORRUPT for a message without a body (read only: nothing changes).
local queue, limit, order = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local after, before, exact = ARGV[5], ARGV[6], ARGV[7]
local sources = {K_PENDING, K_RESERVED, K_DELAYED}
if ARGV[8] == '1' then sources[#sources + 1] = K_CLAIMED end

local lists = {}
if exact ~= '' then
  local member = mem(queue, exact)
  for i, key in ipairs(sources) do
    lists[i] = {}
    if redis.call('ZSCORE', key, member) then lists[i] = {member} end
  end
else
  local lo, hi = bounds(queue, after, before)
  for i, key in ipairs(sources) do lists[i] = range(key, lo, hi, order, limit) end
end
local members = merge(lists, order, limit)
return id_body_pairs(bodies_of(members))
