-- A minimal sliding log (one sorted-set member per admitted request, scored by its time),
-- the yardstick of scripts/bench-redis-cost.sh.
-- KEYS[1] the key; ARGV[1] limit; ARGV[2] window (µs); ARGV[3] a unique request id.
-- Returns {allowed, remaining}.
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - window))
local n = redis.call('ZCARD', KEYS[1])
if n + 1 > limit then return {0, limit - n} end
redis.call('ZADD', KEYS[1], string.format('%d', now), ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
return {1, limit - n - 1}
