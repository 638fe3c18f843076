-- Warm one shard: set the stock of every item and then the fence, which opens it.
-- Idempotent: when the fence already exists and ARGV[2] is '0', nothing changes
-- (publishing twice never adds stock). Recompute passes '1' after rebuilding the
-- buyer records, to overwrite the counts and open the shard under a new epoch.
--
-- KEYS[1]    fence  sk:{a:i}:fence
-- KEYS[2..]  stock  sk:{a:i}:stock:<s>, one per item
-- ARGV[1]    epoch (no '-' or '|'), ARGV[2] force ('0' or '1'),
-- ARGV[3..]  units for each stock key, in KEYS order
--
-- Returns 1 when it wrote, 0 when the shard was already warm.
if ARGV[2] ~= '1' and redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
for k = 2, #KEYS do
  redis.call('SET', KEYS[k], ARGV[k + 1])
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
