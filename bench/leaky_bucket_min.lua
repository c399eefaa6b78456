-- A minimal leaky bucket as a shaper (the state is the time the queue is empty again; an
-- admitted request is told its delay), the yardstick of scripts/bench-redis-cost.sh.
-- KEYS[1] the key; ARGV[1] queue size; ARGV[2] leak interval (µs per request).
-- Returns {allowed, delay µs}.
local size, interval = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local drain = tonumber(redis.call('GET', KEYS[1]) or '0')
if drain < now then drain = now end
if drain + interval - now > size * interval then return {0, drain - now} end
redis.call('SET', KEYS[1], string.format('%d', drain + interval), 'PX',
  math.ceil((drain + interval - now) / 1000))
return {1, drain - now}
