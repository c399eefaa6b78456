-- shardlimit: forget a key's state for one policy.
-- KEYS[1]  base key
-- ARGV[1]  now in microseconds, or "0" to read the server clock (TIME)
-- ARGV[2]  window (µs) for the windowed counters, whose state lives in
--          KEYS[1]..':'..index for the current and previous window; "0" otherwise
-- Returns the number of keys deleted.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local window = tonumber(ARGV[2])
if window == 0 then
  return redis.call('DEL', KEYS[1])
end
local idx = math.floor(now / window)
return redis.call('DEL', KEYS[1] .. ':' .. string.format('%d', idx), KEYS[1] .. ':' .. string.format('%d', idx - 1))
