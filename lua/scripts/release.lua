-- Give a reserved unit back to its shard, only while the buyer record still names
-- this reservation (a late release after a re-buy leaves the new purchase alone).
-- Idempotent: the second call finds no record and returns NOT_HELD.
--
-- KEYS[1] stock   sk:{a:i}:stock:<s>
-- KEYS[2] buyers  sk:{a:i}:buyers:<s>
-- ARGV: user, reservation id, return the unit ('1', the default) or only drop the
--       buyer record ('0': for a FAILED order, whose unit MySQL never had, so
--       giving it back to Redis would hand out a unit that does not exist)
--
-- Returns {RELEASED, units left in the shard} or {NOT_HELD, -1}.
local held = redis.call('HGET', KEYS[2], ARGV[1])
if not held then
  return {'NOT_HELD', -1}
end
local sep = string.find(held, '|', 1, true)
if string.sub(held, 1, sep - 1) ~= ARGV[2] then
  return {'NOT_HELD', -1}
end
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[3] == '0' then
  return {'RELEASED', tonumber(redis.call('GET', KEYS[1]) or '0')}
end
return {'RELEASED', redis.call('INCR', KEYS[1])}
