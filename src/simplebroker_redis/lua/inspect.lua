-- inspect.lua: the messages of one queue for the dashboard: the first of
-- each state with their delivery counts, due times (delayed), holders and
-- lease deadlines (reserved), and the dead-letter journal's entries of
-- messages now in this queue. Read only: nothing is changed.
-- uses: members, bulk
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue, 3 most messages per state, 4 longest body
--       returned (bytes; longer ones are cut), 5 '1' to scan the journal.
-- Returns: {server time µs, {state, count, {id, body, body length,
--           deliveries, due µs or lease deadline µs ('' none), token ('')},
--           ...} per state (pending, delayed, reserved),
--           {id, source queue, deliveries, entry id, ...} from the journal}.
local queue, limit, cut = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local lo, hi = qlo(queue), qhi(queue)
local out = {}
local t = redis.call('TIME')
out[1] = t[1] .. string.format('%06d', tonumber(t[2]))
local names = {'pending', 'delayed', 'reserved'}
for i, key in ipairs({K_PENDING, K_DELAYED, K_RESERVED}) do
  local state = names[i]
  local members = redis.call('ZRANGE', key, lo, hi, 'BYLEX', 'LIMIT', 0, limit)
  local ids = ids_of(members)
  local bodies = hmget_all(K_BODIES, ids)
  local counts = hmget_all(K_DELIVERIES, ids)
  local extra, tokens = {}, {}
  if state == 'delayed' then
    extra = zmscore_all(K_DUE, members)
  elseif state == 'reserved' then
    tokens = hmget_all(K_OWNERS, ids)
    local held = {}
    for j = 1, #ids do held[j] = tokens[j] or '' end
    extra = zmscore_all(K_LEASES, held)
  end
  local list = {}
  for j, id in ipairs(ids) do
    local body = bodies[j] or ''
    list[#list + 1] = id
    list[#list + 1] = string.sub(body, 1, cut)
    list[#list + 1] = #body
    list[#list + 1] = counts[j] or '0'
    list[#list + 1] = extra[j] or ''
    list[#list + 1] = tokens[j] or ''
  end
  out[i + 1] = {state, redis.call('ZLEXCOUNT', key, lo, hi), list}
end
local journal = {}
if ARGV[5] == '1' then
  -- The journal is capped (about 10,000 entries), so one scan is bounded.
  for _, entry in ipairs(redis.call('XRANGE', K_DEAD_LETTERS, '-', '+')) do
    local fields, list = {}, entry[2]
    for i = 1, #list, 2 do fields[list[i]] = list[i + 1] end
    if fields.dead_letter_queue == queue and fields.id then
      journal[#journal + 1] = fields.id
      journal[#journal + 1] = fields.queue or ''
      journal[#journal + 1] = fields.deliveries or '0'
      journal[#journal + 1] = entry[1]
    end
  end
end
out[5] = journal
return out
