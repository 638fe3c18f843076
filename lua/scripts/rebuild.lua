-- Close or reopen one shard for a rebuild from MySQL, under a fencing token.
--
-- A rebuild holds a lease (stockd: a MySQL named lock) and a token that grows with
-- every lease taken. The shard remembers the highest token that touched it, and
-- refuses an older one: a stockd that lost its lease while it still wrote (a stall, a
-- cut connection) cannot close a shard a newer rebuild opened, nor write its stale
-- buyer records and counts over the newer ones.
--
-- KEYS[1] fence  sk:{a:i}:fence
-- KEYS[2] lease  sk:{a:i}:lease   highest token seen
-- KEYS[3] seq    sk:{a:i}:seq     reservation sequence (open: back to 0, the new
--                                 epoch's ids start at 1)
-- then per item j = 1..n (open only):
--   KEYS[2+2j] stock   sk:{a:i}:stock:<s>
--   KEYS[3+2j] buyers  sk:{a:i}:buyers:<s>
-- ARGV[1] 'close' or 'open', ARGV[2] token (decimal), ARGV[3] epoch (open)
-- then per item j, in KEYS order: units, m (buyer records), then m pairs of
--   uid, "<reservation id>|<request id>"
--
-- close: when no newer token touched the shard, records the token and deletes the
-- fence (every reserve answers LOST from then on); returns 1, else 0.
-- open: when the token is still the shard's newest, writes every item's count and
-- buyer records, restarts the sequence, then the fence (which opens the shard);
-- returns 1, else 0 (a newer rebuild owns the shard; nothing written). Restarting the
-- sequence under the new epoch lets the next rebuild tell a lost reservation from one
-- never handed out: under one epoch, every id from 1 to the highest was.
local token = tonumber(ARGV[2])
local held = tonumber(redis.call('GET', KEYS[2]) or '0')

if ARGV[1] == 'close' then
  if held > token then
    return 0
  end
  redis.call('SET', KEYS[2], ARGV[2])
  redis.call('DEL', KEYS[1])
  return 1
end

if held ~= token then
  return 0
end
local a = 4
local n = (#KEYS - 3) / 2
for j = 1, n do
  local stock, buyers = KEYS[2 + 2 * j], KEYS[3 + 2 * j]
  redis.call('SET', stock, ARGV[a])
  local m = tonumber(ARGV[a + 1])
  a = a + 2
  redis.call('DEL', buyers)
  -- HSET in slices: unpack() is bounded by Lua's C stack.
  local k = 0
  while k < m do
    local upto = math.min(m, k + 500)
    local args = {}
    for x = k, upto - 1 do
      args[#args + 1] = ARGV[a + 2 * x]
      args[#args + 1] = ARGV[a + 2 * x + 1]
    end
    redis.call('HSET', buyers, unpack(args))
    k = upto
  end
  a = a + 2 * m
end
redis.call('SET', KEYS[3], '0')
redis.call('SET', KEYS[1], ARGV[3])
return 1
