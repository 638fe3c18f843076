-- Units of item s are on sale again (a release, a rebuild, units a move brought home):
-- clears the sold-out flag and counts a change, so that a mark decided from a look
-- taken before the units came back is refused (soldout_mark.lua).
--
-- KEYS[1] flag    sk:{a}:soldout:<s>
-- KEYS[2] changes sk:{a}:changes:<s>
--
-- Returns 1 when the flag was set (and is now cleared), 0 when it was not.
local n = redis.call('DEL', KEYS[1])
redis.call('INCR', KEYS[2])
return n
