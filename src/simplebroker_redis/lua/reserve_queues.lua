-- reserve_queues.lua: reserve up to `limit` pending messages from several
-- queues in one step, in strict order: all the first queue has (oldest
-- first), then the second's, and so on. Each queue that gives messages gets
-- its own token (a reservation is of one queue, as in reserve.lua), so
-- leases, recovery and dead-lettering stay per queue. Used by Taskiq
-- workers for priorities (a queue's priority queues, highest first) and for
-- listening on several queues.
-- uses: guard, reserving, ordered
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 token prefix (fresh, [0-9a-f], or
--       '<holder>.<random>': the upkeep spares that holder's tokens; the
--       tokens are '<prefix>-<n>' for the n-th queue), 3 limit, 4 lease in us ('-1' =
--       never expires), 5 max deliveries ('0' = unlimited), then pairs
--       (queue, its dead-letter queue or '' for none).
-- Returns: {created_us, deadline_us ('-1' none), next_due_in_us ('-1' none),
--           then per queue that gave messages: token, queue, count, and
--           count triples id, body, deliveries}.
-- Raises: ARG for a malformed list; TOKEN when a token already exists.
local prefix, limit, lease = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if not limit or limit < 1 or not lease or (#ARGV - 5) % 2 ~= 0 or #ARGV < 7 then
  fail('ARG', 'expected a limit, a lease and (queue, dead-letter queue) pairs')
end
local head = open_reservation(lease, prefix)
local names, deads = queue_pairs(6)
local picked = plan_ordered(prefix, limit, names, deads)
apply_ordered(picked, head[1], head[2], ARGV[4], ARGV[5], head)
return head
