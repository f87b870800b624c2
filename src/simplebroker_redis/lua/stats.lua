-- stats.lua: per-queue counts. Pending includes reserved and delayed messages
-- (not yet consumed); claimed are consumed messages awaiting vacuum.
-- uses: members
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 mode: 'one' (ARGV[3] = queue), 'all', or 'range'
--       (registered queues in the lex range ARGV[3]..ARGV[4]).
-- Returns: flat {queue, pending, claimed, ...} sorted by queue name.
local mode = ARGV[2]
local queues
if mode == 'one' then
  queues = {ARGV[3]}
elseif mode == 'all' then
  queues = redis.call('ZRANGE', K_QUEUES, 0, -1)
else
  queues = redis.call('ZRANGE', K_QUEUES, ARGV[3], ARGV[4], 'BYLEX')
end
local out = {}
for _, queue in ipairs(queues) do
  out[#out + 1] = queue
  out[#out + 1] = lexcount(K_PENDING, queue) + lexcount(K_RESERVED, queue)
    + lexcount(K_DELAYED, queue)
  out[#out + 1] = lexcount(K_CLAIMED, queue)
end
return out
