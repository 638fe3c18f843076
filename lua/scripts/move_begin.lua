-- Rebalancing: a move of units of item s is about to take from a donor shard. Called
-- (and answered) before the first TAKE, so that until move_end.lua no sold-out mark
-- (soldout_mark.lua) can pass while the units are between a take and a give.
--
-- KEYS[1] moving  sk:{a}:moving:<s>   sorted set: move id -> deadline (Redis time, ms)
-- ARGV[1] move id (unique per move), [2] lifetime ms (>= 1): past it the entry no
--         longer holds marks back (its mover died; the units it took are lost until a
--         rebuild counts them back, as with every move that ends without its give)
--
-- Returns 1.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + life, ARGV[1])
-- Every entry has the same lifetime, so the newest deadline is the latest: the key
-- never outlives its last entry.
redis.call('PEXPIRE', KEYS[1], life)
return 1
