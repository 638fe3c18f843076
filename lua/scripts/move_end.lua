-- Rebalancing: a move begun with move_begin.lua is over (its give answered, or it
-- ended without one).
--
-- KEYS[1] moving  sk:{a}:moving:<s>
-- KEYS[2] changes sk:{a}:changes:<s>  string int: moves ended that may have moved
--         units, and flags cleared (soldout_clear.lua)
-- ARGV[1] move id, [2] "1" when the move moved units or may have (a take answered
--         units, or a call's outcome is unknown), "0" when every take found nothing
--
-- Returns 1.
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  redis.call('INCR', KEYS[2])
end
return 1
