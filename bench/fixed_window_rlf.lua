-- What rate-limiter-flexible's RateLimiterRedis asks Redis per consume (its Lua script,
-- read from the npm package 11.4.0; written again here, not copied): create the counter
-- with the window's TTL if absent, add the points, read the TTL, set it if it was lost.
-- The client compares the count with the limit. KEYS[1] the key; ARGV[1] points;
-- ARGV[2] window (s). Returns {consumed, ttl ms}.
redis.call('SET', KEYS[1], 0, 'EX', ARGV[2], 'NX')
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  ttl = 1000 * ARGV[2]
end
return {n, ttl}
