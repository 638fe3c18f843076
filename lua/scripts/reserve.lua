-- Reserve one unit for one user on the user's home shard: the duplicate check, the
-- decrement, the buyer record and the stream append, in ONE atomic call on ONE slot.
-- There is no window in which stock is taken and the order message is lost.
--
-- KEYS[1] fence   sk:{a:i}:fence      epoch of the shard's warm-up; missing = state lost
-- KEYS[2] stock   sk:{a:i}:stock:<s>  units left in this shard
-- KEYS[3] buyers  sk:{a:i}:buyers:<s> uid -> "<reservation id>|<request id>"
-- KEYS[4] stream  sk:{a:i}:orders     reservations waiting for orderd
-- KEYS[5] seq     sk:{a:i}:seq        reservation sequence of the shard
-- ARGV: activity, item, shard, user, request id, now (unix ms), and optionally
--       [7] an epoch and [8] the highest sequence the caller has seen handed out in it
--
-- Returns {outcome, reservation id, units left in this shard}, outcome one of
-- RESERVED, RETRY (same request id: the reservation it already made), DUPLICATE,
-- SOLD_OUT, LOST (the shard's state is gone: the caller must recompute), BEHIND
-- (the fence is there but the sequence is below one already handed out under the same
-- epoch: Redis lost writes, as after a failover to a lagging replica or a restart that
-- dropped the last second of its AOF; the caller must recompute; the third field is
-- the sequence found).
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  return {'LOST', '', -1}
end
if ARGV[7] == epoch then
  local seen = tonumber(redis.call('GET', KEYS[5]) or '0')
  if seen < tonumber(ARGV[8]) then
    return {'BEHIND', '', seen}
  end
end
local held = redis.call('HGET', KEYS[3], ARGV[4])
if held then
  local sep = string.find(held, '|', 1, true)
  local rid = string.sub(held, 1, sep - 1)
  local left = tonumber(redis.call('GET', KEYS[2]) or '0')
  if string.sub(held, sep + 1) == ARGV[5] then
    return {'RETRY', rid, left}
  end
  return {'DUPLICATE', rid, left}
end
local left = tonumber(redis.call('GET', KEYS[2]))
if left == nil then
  return {'LOST', '', -1}
end
if left <= 0 then
  return {'SOLD_OUT', '', 0}
end
left = redis.call('DECR', KEYS[2])
local seq = redis.call('INCR', KEYS[5])
local rid = ARGV[1] .. '-' .. ARGV[2] .. '-' .. ARGV[3] .. '-' .. epoch .. '-' .. seq
redis.call('HSET', KEYS[3], ARGV[4], rid .. '|' .. ARGV[5])
redis.call('XADD', KEYS[4], '*', 'rid', rid, 'uid', ARGV[4], 'a', ARGV[1], 's', ARGV[2],
  'req', ARGV[5], 'ts', ARGV[6])
return {'RESERVED', rid, left}
