-- find.lua: literal body-substring search over one queue, in ID order, one
-- bounded chunk per call so a large queue never blocks the server.
-- uses: members
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue, 3 needle, 4 ids still wanted, 5 after ('' or
--       19 digits, exclusive; the resume cursor), 6 before, 7 '1' to include
--       claimed messages, 8 chunk size.
-- Returns: {cursor, id1, id2, ...}; cursor is the last examined id when the
-- scan should continue, '' when it is complete.
local queue, needle, wanted = ARGV[2], ARGV[3], tonumber(ARGV[4])
local chunk = tonumber(ARGV[8])
local sources = {K_PENDING, K_RESERVED, K_DELAYED}
if ARGV[7] == '1' then sources[#sources + 1] = K_CLAIMED end
local lo, hi = bounds(queue, ARGV[5], ARGV[6])
local lists = {}
for i, key in ipairs(sources) do lists[i] = range(key, lo, hi, 'oldest', chunk) end
local members = merge(lists, 'oldest', chunk)
local out = {''}
for _, member in ipairs(members) do
  local body = redis.call('HGET', K_BODIES, mid(member))
  if body and string.find(body, needle, 1, true) then
    out[#out + 1] = mid(member)
    if #out - 1 >= wanted then return out end
  end
end
if #members == chunk then out[1] = mid(members[#members]) end
return out
