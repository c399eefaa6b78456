-- A minimal two-counter sliding window (the previous window's count weighted by the part
-- of it still in the window), the yardstick of scripts/bench-redis-cost.sh.
-- KEYS[1] the key; ARGV[1] limit; ARGV[2] window (ms). Returns {allowed, remaining}.
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local idx = math.floor(now / window)
local k = KEYS[1] .. ':' .. idx
local c = redis.call('MGET', k, KEYS[1] .. ':' .. (idx - 1))
local cur, prev = tonumber(c[1] or '0'), tonumber(c[2] or '0')
local est = prev * (window - (now - idx * window)) / window + cur
if est + 1 > limit then return {0, math.floor(limit - est)} end
redis.call('INCR', k)
if cur == 0 then redis.call('PEXPIRE', k, 2 * window) end
return {1, math.floor(limit - est - 1)}
