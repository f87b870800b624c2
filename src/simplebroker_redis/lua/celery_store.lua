-- celery_store.lua: store one entry of the Celery result backend (a task's
-- result, a group's) and wake the waiters of a task's result, in one step.
-- With the guard on, a task that already succeeded keeps its result: the
-- check Celery's key-value backends make with a separate read (a task that
-- ran twice must not overwrite SUCCESS), made atomic here.
-- uses: guard, members, celery
-- KEYS: the namespace's fixed keys (K_* names in the prelude), then
--       1 the entry (string).
-- ARGV: 1 wake prefix, 2 value, 3 expiry in ms ('' = none), 4 queue whose
--       wake channel to publish on ('' = none), 5 guard ('1' = keep an
--       entry whose JSON says "status": "SUCCESS").
-- Returns: 1 stored, 0 kept (the task had succeeded), -1 nothing done: the
-- guard could not read the stored entry (not JSON: another serializer),
-- so the caller checks it itself.
-- Raises (before any write): ARG (a malformed expiry or key list), WRONGTYPE.
celery_key_count(1)
local entry = KEYS[FIXED_KEYS + 1]
local value, px, queue, guard = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if px ~= '' and not string.find(px, '^[1-9]%d*$') then fail('ARG', 'expiry ' .. tostring(px)) end
check_kind(entry, 'string')
if guard == '1' then
  local current = redis.call('GET', entry)
  if current then
    local readable, meta = pcall(cjson.decode, current)
    if not readable or type(meta) ~= 'table' then return -1 end
    if meta['status'] == 'SUCCESS' then return 0 end
  end
end

if px == '' then
  redis.call('SET', entry, value)
else
  redis.call('SET', entry, value, 'PX', px)
end
if queue ~= '' then wake(queue) end
return 1
