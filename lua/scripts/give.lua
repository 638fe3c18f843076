-- Rebalancing, receiving side: add units taken from another shard.
--
-- KEYS[1] fence   sk:{a:i}:fence
-- KEYS[2] stock   sk:{a:i}:stock:<s>
-- ARGV[1] units (>= 1), [2] this shard's fence (epoch) as the mover read it before
--         its take
--
-- Returns the shard's new count, -1 when its state is lost (no fence or no stock
-- key), or -2 when the shard is under another epoch than the mover read: a rebuild
-- reopened it since, and if that was after the take it counted the taken units again
-- from MySQL (which never knew of the move). The units are dropped in every case:
-- giving them could create units; the caller starts a rebuild for the cases where
-- dropping them loses some. (Comparing with this shard's own fence, not the donor's,
-- keeps moves working between shards warmed under different epochs.)
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
