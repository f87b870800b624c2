-- probe_exists.lua: whether one queue holds any message at all, claimed
-- included (SimpleBroker's queue_exists). Read only.
-- uses: members
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix, 2 queue.
-- Returns: 1 when it holds a message in any state, else 0.
if has_rows(ARGV[2]) then return 1 end
return 0
