-- A minimal token bucket in one hash, the yardstick of scripts/bench-peers.sh's Rust row:
-- what a hand-written script costs Redis per decision (redis-benchmark runs it).
-- KEYS[1] the bucket; ARGV[1] capacity; ARGV[2] tokens refilled per second.
-- Returns {allowed (0/1), tokens left}.
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local b = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(b[1]) or capacity
local ts = tonumber(b[2]) or now
tokens = math.min(capacity, tokens + (now - ts) * rate / 1000000)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 't', tokens, 'ts', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000))
return {allowed, math.floor(tokens)}
