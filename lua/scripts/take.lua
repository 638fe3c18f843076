-- Rebalancing, donor side: take up to ARGV[1] units out of a shard.
-- A move is take (here) then give (give.lua) on another slot; a crash in between
-- loses the units (undersell, repaired by recompute) but can never create one.
--
-- Units taken are in transit until the mover settles them (ZREM of "<id>:<units>", after
-- its give and a raise of sk:{a}:changes:<s>): a look at the shards (look.lua) counts the
-- live entries, so that no look finds every shard empty and marks the item sold out
-- while units are between a take and a give. Written here, in the take's own atomic
-- call, so that no call comes before it.
--
-- KEYS[1] fence   sk:{a:i}:fence
-- KEYS[2] stock   sk:{a:i}:stock:<s>
-- KEYS[3] seq     sk:{a:i}:seq
-- KEYS[4] transit sk:{a:i}:transit:<s>  sorted set: "<move id>:<units taken>" ->
--                                        deadline (Redis time, ms)
-- ARGV[1] wanted units (>= 1), [2] an epoch ('' for none) and [3] the highest
-- sequence the caller has seen handed out in it (as for reserve.lua), [4] the move's
-- id (unique per move), [5] its lifetime in ms (>= 1): past it the entry no longer
-- counts (its mover died, or its give's outcome is unknown; units taken and not given
-- are lost until a rebuild counts them back)
--
-- Returns {units taken (0 when empty), the shard's epoch (for the logs)};
-- {-1, ''} when the shard's state is lost (no fence, or no stock key);
-- {-2, sequence found} when the shard is behind the caller's mark under the same
-- epoch, or {-2, 0} under an older epoch than the caller's (Redis lost writes: its
-- count may hold units that were already sold, so nothing is taken; the caller
-- rebuilds);
-- {-3, the shard's epoch} when the shard is under a newer epoch than the caller's: a
-- rebuild reopened it after the caller's mark. Nothing is taken: a take sent before
-- the rebuild that ran after it (it waited in a queue past its caller's deadline, so
-- no give follows) would take units the rebuild had just counted, and they would stay
-- off sale until the next rebuild. A caller that is only behind on news adopts the
-- epoch and asks again.
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  return {-1, ''}
end
local mine = ARGV[2]
if mine ~= '' and mine ~= epoch then
  if #mine > #epoch or (#mine == #epoch and mine > epoch) then
    -- Older than the caller's epoch: Redis went back to before a rebuild (reserve.lua).
    return {-2, 0}
  end
  return {-3, epoch}
end
if mine == epoch then
  local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
  if seq < tonumber(ARGV[3]) then
    return {-2, seq}
  end
end
local left = tonumber(redis.call('GET', KEYS[2]))
if not left then
  -- The stock key is gone (evicted, deleted) though the fence is there: lost state,
  -- as reserve.lua answers it; an empty shard always holds 0.
  return {-1, ''}
end
if left <= 0 then
  return {0, epoch}
end
local n = math.min(left, tonumber(ARGV[1]))
redis.call('DECRBY', KEYS[2], n)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[5])
-- Entries past their deadline belong to movers that died: swept, so the set stays
-- small.
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
redis.call('ZADD', KEYS[4], now + life, ARGV[4] .. ':' .. n)
-- The key lives as long as its longest-lived entry: a shorter life only ever extends
-- the TTL, never cuts it. (PTTL is -1 on the key ZADD just made. Not PEXPIRE GT: it
-- takes a key without a TTL for an infinite one.)
if redis.call('PTTL', KEYS[4]) < life then
  redis.call('PEXPIRE', KEYS[4], life)
end
return {n, epoch}
