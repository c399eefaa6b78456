-- A minimal layered fixed window with shardlimit's semantics (windows aligned to the
-- clock; allowed only if every layer allows, and a denial consumes nothing), the yardstick
-- of scripts/bench-redis-cost.sh's layered row.
-- KEYS: one key per layer; ARGV[1] limit; ARGV[2] window (ms). Returns {allowed, then
-- per layer remaining}.
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local idx = math.floor(now / window)
local reset = (idx + 1) * window - now
local out, ks, used = {1}, {}, {}
for i = 1, #KEYS do
  ks[i] = KEYS[i] .. ':' .. idx
  used[i] = tonumber(redis.call('GET', ks[i]) or '0')
  if used[i] + 1 > limit then out[1] = 0 end
  out[i + 1] = limit - used[i]
end
if out[1] == 1 then
  for i = 1, #KEYS do
    redis.call('INCR', ks[i])
    if used[i] == 0 then redis.call('PEXPIRE', ks[i], reset) end
    out[i + 1] = limit - used[i] - 1
  end
end
return out
