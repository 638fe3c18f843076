-- Fleet-wide token buckets (the gateway's per-user and per-route limits shared by every
-- gateway): each gateway reports what its local buckets let through since its last
-- report and reads back the fleet-wide level, which its local bucket then takes on.
--
-- KEYS[i]  one bucket each (`sk:fleet:{...}`; one call's keys share one hash tag).
-- ARGV[1]  rate, tokens per second (> 0)      ARGV[2]  burst (>= 1)
-- ARGV[2+i] tokens taken from KEYS[i] since the last report (>= 0)
-- Value "<tokens> <ms>": the level at the last report and the Redis time of it; a
-- missing key is a full bucket (the key expires once it would be full again).
-- The level may go negative: takes reported late are owed, and the bucket refills
-- from there. Returns the levels after the takes, as strings ("%.3f").
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local out = {}
for i, k in ipairs(KEYS) do
  local tokens, last = burst, now
  local v = redis.call('GET', k)
  if v then
    local sep = string.find(v, ' ', 1, true)
    if sep then
      tokens = tonumber(string.sub(v, 1, sep - 1)) or burst
      last = tonumber(string.sub(v, sep + 1)) or now
    end
  end
  if now > last then
    tokens = math.min(burst, tokens + (now - last) * rate / 1000)
  end
  tokens = tokens - (tonumber(ARGV[i + 2]) or 0)
  local ttl = math.ceil((burst - tokens) / rate * 1000) + 1000
  redis.call('SET', k, string.format('%.3f %.0f', tokens, now), 'PX', ttl)
  out[i] = string.format('%.3f', tokens)
end
return out
