-- Rebalancing, donor side: take up to ARGV[1] units out of a shard.
-- A move is take (here) then give (give.lua) on another slot; a crash in between
-- loses the units (undersell, repaired by recompute) but can never create one.
--
-- KEYS[1] fence   sk:{a:i}:fence
-- KEYS[2] stock   sk:{a:i}:stock:<s>
-- ARGV: wanted units (>= 1)
--
-- Returns the units taken (0 when empty), or -1 when the shard's state is lost.
if not redis.call('GET', KEYS[1]) then
  return -1
end
local left = tonumber(redis.call('GET', KEYS[2]) or '0')
if left <= 0 then
  return 0
end
local n = math.min(left, tonumber(ARGV[1]))
redis.call('DECRBY', KEYS[2], n)
return n
