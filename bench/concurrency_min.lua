-- A minimal concurrency limit (one sorted-set member per lease, scored by its expiry),
-- the yardstick of scripts/bench-redis-cost.sh.
-- KEYS[1] the key; ARGV[1] limit; ARGV[2] lease TTL (µs); ARGV[3] the lease id.
-- Returns {allowed, remaining}.
local limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
local n = redis.call('ZCARD', KEYS[1])
if n + 1 > limit then return {0, limit - n} end
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl / 1000))
return {1, limit - n - 1}
