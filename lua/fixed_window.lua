-- shardlimit: fixed window counter.
-- KEYS[1]  base key (carries the hash tag); the counter lives in KEYS[1]..':'..window_index
-- ARGV[1]  now in microseconds, or "0" to read the server clock (TIME)
-- ARGV[2]  limit            ARGV[3] window (µs)
-- ARGV[4]  cost             ARGV[5] "1" = peek (never writes)
-- Returns {allowed, remaining, reset_after_us, retry_after_us (-1 = absent), delay_us}
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local limit = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local idx = math.floor(now / window)
local key = KEYS[1] .. ':' .. string.format('%d', idx)
local used = tonumber(redis.call('GET', key) or '0')
local reset = (idx + 1) * window - now
if cost > limit then
  return {0, math.max(limit - used, 0), reset, -1, 0}
end
if used + cost > limit then
  -- the next window starts empty and cost <= limit, so it fits there
  return {0, math.max(limit - used, 0), reset, reset, 0}
end
if ARGV[5] ~= '1' then
  redis.call('INCRBY', key, cost)
  redis.call('PEXPIRE', key, math.ceil(reset / 1000))
  used = used + cost
end
return {1, limit - used, reset, -1, 0}
