-- lib/tokens.lua: a reservation's token: its record, the IDs it links, and
-- the delivery counts of the messages it holds.
-- uses: guard, members, bulk
--
-- A reservation is a token: tokens[token] holds its JSON record {q, t, c,
-- d, l, m, x} (queue, move target, created us, deadline us or -1, lease us,
-- max deliveries, dead-letter queue), token_ids holds "<token> <id>" per
-- reserved id, owners[id] = token, and leases scores the token by deadline.

-- Check the types of the keys a reservation change writes (before its
-- first write). The list is built per call: module code runs before bind()
-- names the keys, so a table built at load time would hold nothing.
local function check_reservation_keys()
  check_keys({K_QUEUES, K_PENDING, K_RESERVED, K_DELAYED, K_DUE, K_CLAIMED,
    K_BODIES, K_DELIVERIES, K_OWNERS, K_TOKENS, K_TOKEN_IDS, K_LEASES})
end

-- The lex range of a token's links in token_ids: ["<token> ", "<token>!").
local function token_lo(token) return '[' .. token .. ' ' end
local function token_hi(token) return '(' .. token .. '!' end

-- The links "<token> <id>" of every ID the token holds.
local function token_members(token)
  return redis.call('ZRANGE', K_TOKEN_IDS, token_lo(token), token_hi(token), 'BYLEX')
end

-- How many IDs the token links (reads token_ids before any write).
local function token_links(token)
  local count = redis.call('ZLEXCOUNT', K_TOKEN_IDS, token_lo(token), token_hi(token))
  verified(K_TOKEN_IDS)
  return count
end

-- Whether the token still links an ID (one read, at most one member).
local function token_holds_any(token)
  return redis.call('ZRANGE', K_TOKEN_IDS, token_lo(token), token_hi(token),
    'BYLEX', 'LIMIT', 0, 1)[1] ~= nil
end

-- Forget a token that holds nothing any more: its record and its lease.
local function drop_token(token)
  redis.call('HDEL', K_TOKENS, token)
  redis.call('ZREM', K_LEASES, token)
end

-- Decode the record `raw` of a token; raises CORRUPT when it is damaged
-- (not JSON, or fields missing).
local function decode_record(token, raw)
  local ok, record = pcall(cjson.decode, raw)
  if not ok or type(record) ~= 'table' or type(record.q) ~= 'string'
    or tonumber(record.d) == nil or tonumber(record.l) == nil then
    fail('CORRUPT', 'reservation ' .. token .. ' has a damaged record')
  end
  return record
end

-- Read and decode a token's record; nil when the token does not exist.
local function read_record(token)
  local raw = redis.call('HGET', K_TOKENS, token)
  verified(K_TOKENS)
  if not raw then return nil end
  return decode_record(token, raw)
end

-- The IDs a settlement or release names: ARGV[first..], or every ID the
-- token holds when that is the single argument '*'.
local function selected_ids(token, first)
  if ARGV[first] == '*' then return ids_of(token_members(token)) end
  local ids = {}
  for i = first, #ARGV do ids[#ids + 1] = ARGV[i] end
  return ids
end

-- The IDs of `ids` that `token` still holds in `queue`, in order (reads
-- owners and reserved).
local function held_ids(token, queue, ids)
  if #ids == 0 then return {} end
  local owners = hmget_all(K_OWNERS, ids)
  local members = {}
  for i, id in ipairs(ids) do members[i] = mem(queue, id) end
  local reserved = zmscore_all(K_RESERVED, members)
  local held = {}
  for i, id in ipairs(ids) do
    if owners[i] == token and reserved[i] then held[#held + 1] = id end
  end
  return held
end

-- Delivery counts of `ids` (one HMGET); raises CORRUPT for one that is not a count.
local function delivery_counts(ids)
  local raw = hmget_all(K_DELIVERIES, ids)
  local counts = {}
  for i, id in ipairs(ids) do
    local count = tonumber(raw[i] or '0')
    if not count or count < 0 or count ~= math.floor(count) then
      fail('CORRUPT', 'message ' .. id .. ' has a damaged delivery count')
    end
    counts[i] = count
  end
  return counts
end
