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
--                      for one unit, "<reservation id>|<request id>|<k>" for k > 1
-- ARGV[1] activity, [2] shard, [3] now (unix ms), [4] an epoch ('' for none) and
-- [5] the highest sequence the caller has seen handed out in it; then per
-- reservation j: ARGV[1+5j] item, ARGV[2+5j] user, ARGV[3+5j] request id,
-- ARGV[4+5j] W3C traceparent ('' for none; when given, the entry gets a `tp` field
-- after the others), ARGV[5+5j] units k (>= 1).
--
-- A reservation is k units: the duplicate check, the decrement by k, the buyer
-- record holding k and the stream entry (with a `q` field when k > 1; an entry
-- without `q` is one unit) are one step. A user holds one reservation per item,
-- whatever its k.
--
-- Returns a flat array, four fields per reservation in order:
-- {outcome, reservation id, units left in this shard, units held}, outcome one of
-- RESERVED, RETRY (same request id: the reservation it already made), DUPLICATE,
-- SOLD_OUT (the shard is empty), SHORT (the shard holds 1..k-1 units: nothing taken,
-- the caller moves units here and calls again), LOST (the shard's state is gone:
-- the caller must recompute), BEHIND
-- (the fence is there but the sequence is below one already handed out under the same
-- epoch: Redis lost writes, as after a failover to a lagging replica or a restart that
-- dropped the last second of its AOF; the caller must recompute; the third field is
-- the sequence found; also when the shard is under an epoch older than the caller's,
-- with 0). LOST and BEHIND from the fence check answer every reservation of the call,
-- and nothing is written.
--
-- A call that answers RETRY or DUPLICATE and writes nothing else rewrites the fence
-- with its own value: the caller's `WAIT` counts replicas up to its connection's
-- offset, which a server may move on writes only, and then a resend (or a second
-- click under a new request id) would be acknowledged at once, before the replica
-- holds the reservation it names (one written by another call, maybe on another
-- connection). (Redis 7.0 moves it on reads too, as measured here;
-- the write makes it hold either way.) Replication is one ordered stream, so a replica
-- that holds this write holds every earlier one.
local n = (#KEYS - 3) / 2
local out = {}
local function every(outcome, left)
  for _ = 1, n do
    out[#out + 1] = outcome
    out[#out + 1] = ''
    out[#out + 1] = left
    out[#out + 1] = 0
  end
  return out
end

local epoch = redis.call('GET', KEYS[1])
if not epoch then
  return every('LOST', -1)
end
-- The shard under an epoch older than the caller's (epochs are base-36 times: longer
-- is newer, equal lengths compare as text): Redis went back to before a rebuild the
-- caller saw open (a failover to a replica that lacked it). Every sequence of the
-- caller's epoch is gone: BEHIND with 0 found, nothing written.
local mine = ARGV[4]
if mine ~= '' and mine ~= epoch and (#mine > #epoch or (#mine == #epoch and mine > epoch)) then
  return every('BEHIND', 0)
end
-- The shard's sequence, read once (nil until needed) and handed out locally.
local seq = nil
if ARGV[4] == epoch then
  seq = tonumber(redis.call('GET', KEYS[2]) or '0')
  if seq < tonumber(ARGV[5]) then
    return every('BEHIND', seq)
  end
end

-- The call's writes are gathered and made once at the end: per item one DECRBY of
-- what its reservations took and one HSET of their buyer records, one SET of the
-- sequence; only the stream entries are one command each. Every read goes through
-- these tables first, so each reservation still sees the ones before it exactly as
-- if they had been separate calls. The script is atomic, and its effects replicate
-- as one MULTI/EXEC, so nobody sees the writes in another order. Why: each write
-- command costs the master, its AOF and every replica once per reservation.
local left_of = {}    -- stock key -> units left (false: the key is missing)
local taken = {}      -- stock key -> units taken in this call
local records = {}    -- buyers key -> {uid, record, uid, record, ...} to write
local pending = {}    -- buyers key -> uid -> record written in this call
local order = {}      -- stock keys in first-touched order (deterministic writes)

local function stock_left(stock)
  local left = left_of[stock]
  if left == nil then
    left = tonumber(redis.call('GET', stock)) or false
    left_of[stock] = left
    taken[stock] = 0
    order[#order + 1] = stock
  end
  return left
end

local function reserve(stock, buyers, item, user, req, tp, k)
  local mine = pending[buyers]
  local held = mine and mine[user] or redis.call('HGET', buyers, user)
  if held then
    local sep = string.find(held, '|', 1, true)
    local rid = string.sub(held, 1, sep - 1)
    local rest = string.sub(held, sep + 1)
    local q = 1
    local sep2 = string.find(rest, '|', 1, true)
    if sep2 then
      q = tonumber(string.sub(rest, sep2 + 1))
      rest = string.sub(rest, 1, sep2 - 1)
    end
    local left = stock_left(stock) or 0
    if rest == req then
      return 'RETRY', rid, left, q
    end
    return 'DUPLICATE', rid, left, q
  end
  local left = stock_left(stock)
  if left == false then
    return 'LOST', '', -1, 0
  end
  if left <= 0 then
    return 'SOLD_OUT', '', 0, 0
  end
  if left < k then
    return 'SHORT', '', left, 0
  end
  left = left - k
  left_of[stock] = left
  taken[stock] = taken[stock] + k
  if seq == nil then
    seq = tonumber(redis.call('GET', KEYS[2]) or '0')
  end
  seq = seq + 1
  local rid = ARGV[1] .. '-' .. item .. '-' .. ARGV[2] .. '-' .. epoch .. '-' .. seq
  local record
  if k == 1 then
    record = rid .. '|' .. req
    if tp == '' then
      redis.call('XADD', KEYS[3], '*', 'rid', rid, 'uid', user, 'a', ARGV[1], 's', item,
        'req', req, 'ts', ARGV[3])
    else
      redis.call('XADD', KEYS[3], '*', 'rid', rid, 'uid', user, 'a', ARGV[1], 's', item,
        'req', req, 'ts', ARGV[3], 'tp', tp)
    end
  else
    record = rid .. '|' .. req .. '|' .. k
    if tp == '' then
      redis.call('XADD', KEYS[3], '*', 'rid', rid, 'uid', user, 'a', ARGV[1], 's', item,
        'req', req, 'ts', ARGV[3], 'q', k)
    else
      redis.call('XADD', KEYS[3], '*', 'rid', rid, 'uid', user, 'a', ARGV[1], 's', item,
        'req', req, 'ts', ARGV[3], 'q', k, 'tp', tp)
    end
  end
  if not mine then
    mine = {}
    pending[buyers] = mine
    records[buyers] = {}
  end
  mine[user] = record
  local r = records[buyers]
  r[#r + 1] = user
  r[#r + 1] = record
  return 'RESERVED', rid, left, k
end

local wrote, retried = false, false
local buyer_keys = {}
for j = 1, n do
  local buyers = KEYS[3 + 2 * j]
  local outcome, rid, left, q = reserve(KEYS[2 + 2 * j], buyers,
    ARGV[1 + 5 * j], ARGV[2 + 5 * j], ARGV[3 + 5 * j], ARGV[4 + 5 * j],
    tonumber(ARGV[5 + 5 * j]))
  if outcome == 'RESERVED' and #records[buyers] == 2 then
    buyer_keys[#buyer_keys + 1] = buyers
  end
  wrote = wrote or outcome == 'RESERVED'
  retried = retried or outcome == 'RETRY' or outcome == 'DUPLICATE'
  out[#out + 1] = outcome
  out[#out + 1] = rid
  out[#out + 1] = left
  out[#out + 1] = q
end
for _, stock in ipairs(order) do
  local t = taken[stock]
  if t == 1 then
    redis.call('DECR', stock)
  elseif t > 1 then
    redis.call('DECRBY', stock, t)
  end
end
for _, buyers in ipairs(buyer_keys) do
  redis.call('HSET', buyers, unpack(records[buyers]))
end
if wrote then
  redis.call('SET', KEYS[2], seq)
end
if retried and not wrote then
  redis.call('SET', KEYS[1], epoch)
end
return out
