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
--
-- NOT_HELD rewrites the fence with its own value. A caller that waits for replicas
-- retries a release that was not acknowledged, maybe on another connection; the retry
-- finds the record gone. `WAIT` counts replicas up to its connection's offset, and a
-- connection that never wrote has none where a server moves it on writes only, so its
-- `WAIT` would answer at once, before a replica holds the first call's release. (Redis
-- 7.0 moves it on reads too, as measured here; the write makes it hold either way.)
-- Replication is one ordered stream: a replica that holds this write holds every
-- earlier one.
local fence = redis.call('GET', KEYS[3])
if not fence then
  return {'CLOSED', -1, 0}
end
local held = redis.call('HGET', KEYS[2], ARGV[1])
local sep = held and string.find(held, '|', 1, true)
if not held or string.sub(held, 1, sep - 1) ~= ARGV[2] then
  redis.call('SET', KEYS[3], fence)
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
