#!lua flags=no-writes
-- A look at one shard of item s, for a sold-out decision: the units it holds and the
-- moves that took units out of it and have not settled (take.lua), read at once.
-- Units in transit are on no shard: a look that counts them is not a look that found
-- the item empty.
--
-- KEYS[1] stock   sk:{a:i}:stock:<s>
-- KEYS[2] transit sk:{a:i}:transit:<s>
--
-- Returns {units (0 for a missing key), live records (deadline after now), the units
-- they took (each record is "<move id>:<units>")}. Writes
-- nothing, and says so (the flag above): a master paused for writes (CLIENT PAUSE
-- WRITE, as during a failover's hand-over) still answers it, as it answers a GET.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local units = tonumber(redis.call('GET', KEYS[1]) or '0')
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
local moving = 0
for _, record in ipairs(live) do
  moving = moving + (tonumber(string.match(record, ':(%d+)$')) or 0)
end
return {units, #live, moving}
