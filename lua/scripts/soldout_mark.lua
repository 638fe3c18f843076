-- Sets the sold-out flag of item s: the caller looked at every shard (look.lua) and
-- found no units and none in transit. Refused when that look may have missed units:
-- the change count moved since the caller read it, before its look (a move settled,
-- or units came back and cleared the flag, during the look).
--
-- Why the count closes the gap: a move is a take (which records its units in transit
-- on the donor), a give, a raise of the count, then a settle (which ends the record).
-- A look that read the donor after the take saw the units in transit, unless it read
-- it after the settle; then the count was raised before that read, so either after
-- the caller read the count (refused here) or before it, and then the give had landed
-- before the look began, and the look saw the units on the home shard.
--
-- KEYS[1] changes sk:{a}:changes:<s>  string int: moves settled that moved units,
--         and flags cleared (soldout_clear.lua)
-- KEYS[2] flag    sk:{a}:soldout:<s>
-- ARGV[1] the change count the caller read before its look ("" when there was none)
--
-- Returns 1 when this call set the flag, 0 when it was set already, -2 when the change
-- count differs.
local changes = redis.call('GET', KEYS[1]) or ''
if changes ~= ARGV[1] then
  return -2
end
if redis.call('SET', KEYS[2], '1', 'NX') then
  return 1
end
return 0
