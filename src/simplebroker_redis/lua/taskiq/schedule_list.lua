-- schedule_list.lua: every stored Taskiq schedule, and the claimed runs
-- whose claim lease expired unsent (their scheduler died): those are due to
-- be claimed again (schedule_claim.lua 'retry'). Read only.
-- uses: time
-- KEYS: the namespace's fixed keys (K_* names in the prelude).
-- ARGV: 1 wake prefix.
-- Returns: {{id1, json1, ...}, {id1, run1, json1, claimed at (server us), ...}}.
local now = now_us()
local lost = {}
local claims = redis.call('HGETALL', K_SCHEDULE_CLAIMS)
for i = 1, #claims, 2 do
  local ok, record = pcall(cjson.decode, claims[i + 1])
  -- A damaged record is left for schedule_claim.lua to report.
  if ok and type(record) == 'table' and type(record.s) == 'string'
      and tonumber(record.d) and tonumber(record.d) < now then
    local id, run = string.match(claims[i], '^(.*) (%S+)$')
    if id then
      lost[#lost + 1] = id
      lost[#lost + 1] = run
      lost[#lost + 1] = record.s
      lost[#lost + 1] = record.t or '0'
    end
  end
end
return {redis.call('HGETALL', K_SCHEDULES), lost}
