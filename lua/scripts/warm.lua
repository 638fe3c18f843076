-- Warm one shard: set the stock of every item and then the fence, which opens it.
-- Idempotent: when the fence already exists and ARGV[2] is '0', nothing changes
-- (publishing twice never adds stock). Nor does it write, unforced, on a shard a
-- rebuild has touched (its lease key holds a fencing token, rebuild.lua): that shard
-- was warmed before, and a missing fence there is a rebuild's close. A publish that
-- read the activity unpublished, and whose warm-up lands after another stockd
-- published and sold, and a rebuild then closed the shard, would otherwise reopen it
-- mid-rebuild with its stale counts and no buyer records. ARGV[2] '1' (tests) writes
-- whatever is there.
--
-- KEYS[1]    fence  sk:{a:i}:fence
-- KEYS[2]    lease  sk:{a:i}:lease
-- KEYS[3..]  stock  sk:{a:i}:stock:<s>, one per item
-- ARGV[1]    epoch (no '-' or '|'), ARGV[2] force ('0' or '1'),
-- ARGV[3..]  units for each stock key, in KEYS order (ARGV[k] for KEYS[k])
--
-- Returns 1 when it wrote, 0 when the shard was already warm (or rebuilt).
if ARGV[2] ~= '1' and (redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1) then
  return 0
end
for k = 3, #KEYS do
  redis.call('SET', KEYS[k], ARGV[k])
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
