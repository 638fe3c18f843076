-- Give a reservation's units back to its shard, only while the buyer record still
-- names this reservation (a late release after a re-buy leaves the new purchase
-- alone). The units are the k the buyer record holds ("<rid>|<req>|<k>"; a record
-- without k holds one). Idempotent: the second call finds no record and returns
-- NOT_HELD.
--
-- KEYS[1] stock   sk:{a:i}:stock:<s>
-- KEYS[2] buyers  sk:{a:i}:buyers:<s>
-- KEYS[3] fence   sk:{a:i}:fence
-- ARGV: user, reservation id, return the units ('1', the default) or only drop the
--       buyer record ('0': for a FAILED order, whose unit MySQL never had, so
--       giving it back to Redis would hand out a unit that does not exist)
--
-- Returns {RELEASED, units left in the shard, units released} or {NOT_HELD, -1, 0}
-- (units released is 0 when only the record was dropped), or {CLOSED, -1, 0} when the
-- shard has no fence: a rebuild closed it (or Redis lost it) and will write the buyer
-- records and counts of its MySQL snapshot over whatever a release did now, so the
-- release would be undone. Nothing is written; the caller retries after the reopen,
-- when the records and counts agree with the snapshot again.
if not redis.call('GET', KEYS[3]) then
  return {'CLOSED', -1, 0}
end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if not held then
  return {'NOT_HELD', -1, 0}
end
local sep = string.find(held, '|', 1, true)
if string.sub(held, 1, sep - 1) ~= ARGV[2] then
  return {'NOT_HELD', -1, 0}
end
local k = 1
local sep2 = string.find(held, '|', sep + 1, true)
if sep2 then
  k = tonumber(string.sub(held, sep2 + 1)) or 1
end
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[3] == '0' then
  return {'RELEASED', tonumber(redis.call('GET', KEYS[1]) or '0'), 0}
end
return {'RELEASED', redis.call('INCRBY', KEYS[1], k), k}
