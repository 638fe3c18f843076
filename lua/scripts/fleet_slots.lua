-- The admission cap shared by every gateway: in-flight slots of one item, leased.
-- Each gateway holds a number of slots (a field of the item's hash); a call sets the
-- caller's holding to what it may have now: at most `want`, and never more than the
-- cap minus what the other gateways hold. Holdings expire with their gateway (a
-- gateway that stops calling loses its slots after `ttl_ms`).
--
-- KEYS[1]  `sk:fleet:{a}:slots:<s>`: hash gateway id -> "<held> <expires at ms>"
-- ARGV[1]  gateway id   ARGV[2] want   ARGV[3] cap   ARGV[4] in flight at the
--          caller now   ARGV[5] ttl_ms
-- Returns the slots granted (0..=want). The caller's holding is recorded as
-- max(granted, in flight), so calls it already has in flight still count for the
-- others.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me = ARGV[1]
local want = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local in_flight = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local others = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= me then
    local v = all[i + 1]
    local sep = string.find(v, ' ', 1, true)
    local held = tonumber(string.sub(v, 1, (sep or 0) - 1)) or 0
    local exp = sep and tonumber(string.sub(v, sep + 1)) or 0
    if exp <= now then
      redis.call('HDEL', KEYS[1], all[i])
    else
      others = others + held
    end
  end
end
local grant = math.max(0, math.min(want, cap - others))
local hold = math.max(grant, in_flight)
redis.call('HSET', KEYS[1], me, string.format('%d %.0f', hold, now + ttl))
redis.call('PEXPIRE', KEYS[1], ttl)
return grant
