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
-- The key lives as long as its longest-lived entry: rounds have different lifetimes,
-- so a shorter one only ever extends the TTL, never cuts it. (PTTL is -1 on the key
-- ZADD just made. Not PEXPIRE GT: it takes a key without a TTL for an infinite one.)
if redis.call('PTTL', KEYS[1]) < life then
  redis.call('PEXPIRE', KEYS[1], life)
end
return 1
