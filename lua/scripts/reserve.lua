-- Reserve units on ONE shard for one or more users, each reservation being the
-- duplicate check, the decrement, the buyer record and the stream append, in ONE
-- atomic call on ONE slot. There is no window in which stock is taken and the order
-- message is lost. stockd sends every reservation that queued for a shard while its
-- previous call was in flight (group commit), so one call may carry several; each
-- is decided exactly as if it had been called alone, in order.
--
-- KEYS[1] fence   sk:{a:i}:fence      epoch of the shard's warm-up; missing = state lost
-- KEYS[2] seq     sk:{a:i}:seq        reservation sequence of the shard
-- KEYS[3] stream  sk:{a:i}:orders     reservations waiting for orderd
-- then per reservation j = 1..n:
--   KEYS[2+2j] stock   sk:{a:i}:stock:<s>  units left in this shard
--   KEYS[3+2j] buyers  sk:{a:i}:buyers:<s> uid -> "<reservation id>|<request id>"
-- ARGV[1] activity, [2] shard, [3] now (unix ms), [4] an epoch ('' for none) and
-- [5] the highest sequence the caller has seen handed out in it; then per
-- reservation j: ARGV[2+4j] item, ARGV[3+4j] user, ARGV[4+4j] request id,
-- ARGV[5+4j] W3C traceparent ('' for none; when given, the entry gets a `tp` field
-- after the others).
--
-- Returns a flat array, three fields per reservation in order:
-- {outcome, reservation id, units left in this shard}, outcome one of
-- RESERVED, RETRY (same request id: the reservation it already made), DUPLICATE,
-- SOLD_OUT, LOST (the shard's state is gone: the caller must recompute), BEHIND
-- (the fence is there but the sequence is below one already handed out under the same
-- epoch: Redis lost writes, as after a failover to a lagging replica or a restart that
-- dropped the last second of its AOF; the caller must recompute; the third field is
-- the sequence found). LOST and BEHIND from the fence check answer every reservation
-- of the call, and nothing is written.
--
-- A call that answers RETRY and writes nothing else rewrites the fence with its own
-- value: the caller's `WAIT` counts replicas up to the last write of its connection,
-- and without a write of its own a resend would be acknowledged at once, before the
-- replica holds the reservation it names (one written by another call, maybe on
-- another connection). Replication is one ordered stream, so a replica that holds
-- this write holds every earlier one.
local n = (#KEYS - 3) / 2
local out = {}
local function every(outcome, left)
  for _ = 1, n do
    out[#out + 1] = outcome
    out[#out + 1] = ''
    out[#out + 1] = left
  end
  return out
end

local epoch = redis.call('GET', KEYS[1])
if not epoch then
  return every('LOST', -1)
end
if ARGV[4] == epoch then
  local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
  if seen < tonumber(ARGV[5]) then
    return every('BEHIND', seen)
  end
end

local function reserve(stock, buyers, item, user, req, tp)
  local held = redis.call('HGET', buyers, user)
  if held then
    local sep = string.find(held, '|', 1, true)
    local rid = string.sub(held, 1, sep - 1)
    local left = tonumber(redis.call('GET', stock) or '0')
    if string.sub(held, sep + 1) == req then
      return 'RETRY', rid, left
    end
    return 'DUPLICATE', rid, left
  end
  local left = tonumber(redis.call('GET', stock))
  if left == nil then
    return 'LOST', '', -1
  end
  if left <= 0 then
    return 'SOLD_OUT', '', 0
  end
  left = redis.call('DECR', stock)
  local seq = redis.call('INCR', KEYS[2])
  local rid = ARGV[1] .. '-' .. item .. '-' .. ARGV[2] .. '-' .. epoch .. '-' .. seq
  redis.call('HSET', buyers, user, rid .. '|' .. req)
  if tp == '' then
    redis.call('XADD', KEYS[3], '*', 'rid', rid, 'uid', user, 'a', ARGV[1], 's', item,
      'req', req, 'ts', ARGV[3])
  else
    redis.call('XADD', KEYS[3], '*', 'rid', rid, 'uid', user, 'a', ARGV[1], 's', item,
      'req', req, 'ts', ARGV[3], 'tp', tp)
  end
  return 'RESERVED', rid, left
end

local wrote, retried = false, false
for j = 1, n do
  local outcome, rid, left = reserve(KEYS[2 + 2 * j], KEYS[3 + 2 * j],
    ARGV[2 + 4 * j], ARGV[3 + 4 * j], ARGV[4 + 4 * j], ARGV[5 + 4 * j])
  wrote = wrote or outcome == 'RESERVED'
  retried = retried or outcome == 'RETRY'
  out[#out + 1] = outcome
  out[#out + 1] = rid
  out[#out + 1] = left
end
if retried and not wrote then
  redis.call('SET', KEYS[1], epoch)
end
return out
