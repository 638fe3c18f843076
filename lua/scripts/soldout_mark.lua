-- Sets the sold-out flag of item s: the caller looked at every shard and found them
-- empty. Refused when that look may have missed units: a move is between a take and
-- a give now (moving), or the change count moved since the caller read it, before its
-- look (a move ended, or units came back and cleared the flag, during the look).
--
-- KEYS[1] moving  sk:{a}:moving:<s>   (move_begin.lua)
-- KEYS[2] changes sk:{a}:changes:<s>  (move_end.lua, soldout_clear.lua)
-- KEYS[3] flag    sk:{a}:soldout:<s>
-- ARGV[1] the change count the caller read before its look ("" when there was none)
--
-- Returns 1 when this call set the flag, 0 when it was set already, -1 when a move is
-- under way, -2 when the change count differs.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Entries past their deadline belong to movers that died: they hold nothing back.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) > 0 then
  return -1
end
local changes = redis.call('GET', KEYS[2]) or ''
if changes ~= ARGV[1] then
  return -2
end
if redis.call('SET', KEYS[3], '1', 'NX') then
  return 1
end
return 0
