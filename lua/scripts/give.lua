-- Rebalancing, receiving side: add units taken from another shard.
--
-- KEYS[1] fence   sk:{a:i}:fence
-- KEYS[2] stock   sk:{a:i}:stock:<s>
-- ARGV: units (>= 1)
--
-- Returns the shard's new count, or -1 when its state is lost (the units are then
-- dropped: undersell, repaired by recompute).
if not redis.call('GET', KEYS[1]) then
  return -1
end
return redis.call('INCRBY', KEYS[2], tonumber(ARGV[1]))
