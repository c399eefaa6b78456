-- A minimal fixed window with shardlimit's semantics (windows aligned to the clock, a
-- denied check consumes nothing), the yardstick of scripts/bench-redis-cost.sh.
-- KEYS[1] the key; ARGV[1] limit; ARGV[2] window (ms). Returns {allowed, remaining, reset ms}.
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local idx = math.floor(now / window)
local k = KEYS[1] .. ':' .. idx
local used = tonumber(redis.call('GET', k) or '0')
local reset = (idx + 1) * window - now
if used + 1 > limit then return {0, limit - used, reset} end
redis.call('INCR', k)
if used == 0 then redis.call('PEXPIRE', k, reset) end
return {1, limit - used - 1, reset}
