-- Rebalancing, receiving side: add units taken from another shard.
--
-- KEYS[1] fence   sk:{a:i}:fence
-- KEYS[2] stock   sk:{a:i}:stock:<s>
-- ARGV[1] units (>= 1), [2] the epoch the take answered
--
-- Returns the shard's new count, -1 when its state is lost (no fence or no stock
-- key), or -2 when the shard is
-- under another epoch than the take's: a rebuild opened it since the take, and counted
-- the taken units again from MySQL (which never knew of the move). In both cases the
-- units are dropped, which for -2 is exact and for -1 an undersell the recompute
-- repairs; giving them would create units.
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  return -1
end
if epoch ~= ARGV[2] then
  return -2
end
-- A missing stock key is lost state too (reserve.lua answers it LOST): INCRBY would
-- make a key holding only these units and hide the loss from the next reserve.
if redis.call('EXISTS', KEYS[2]) == 0 then
  return -1
end
return redis.call('INCRBY', KEYS[2], tonumber(ARGV[1]))
