-- Rebalancing, donor side: take up to ARGV[1] units out of a shard.
-- A move is take (here) then give (give.lua) on another slot; a crash in between
-- loses the units (undersell, repaired by recompute) but can never create one.
--
-- KEYS[1] fence   sk:{a:i}:fence
-- KEYS[2] stock   sk:{a:i}:stock:<s>
-- KEYS[3] seq     sk:{a:i}:seq
-- ARGV[1] wanted units (>= 1), [2] an epoch ('' for none) and [3] the highest
-- sequence the caller has seen handed out in it (as for reserve.lua)
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
return {n, epoch}
