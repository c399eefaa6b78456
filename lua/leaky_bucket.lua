-- shardlimit: leaky bucket as a shaper (a queue that drains at a steady rate). The state
-- is one integer: the time (µs) at which the queue is empty again. An admitted request
-- is told how long to wait (delay) for its slot; a request that would overflow the
-- queue is denied.
-- KEYS[1]  the drain-time key
-- ARGV[1]  now in microseconds, or "0" to read the server clock (TIME)
-- ARGV[2]  capacity (queue size in units)   ARGV[3] leak interval: µs per unit
-- ARGV[4]  cost             ARGV[5] "1" = peek (never writes)
-- Returns {allowed, remaining, reset_after_us, retry_after_us (-1 = absent), delay_us}
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local capacity = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local drain = tonumber(redis.call('GET', KEYS[1]) or '0')
if drain < now then drain = now end
local queue = capacity * interval
local free = math.floor((queue - (drain - now)) / interval)
if cost > capacity then
  return {0, free, drain - now, -1, 0}
end
local new_drain = drain + cost * interval
if new_drain - now > queue then
  return {0, free, drain - now, new_drain - queue - now, 0}
end
if ARGV[5] ~= '1' then
  redis.call('SET', KEYS[1], string.format('%d', new_drain), 'PX', math.ceil((new_drain - now) / 1000))
  return {1, math.floor((queue - (new_drain - now)) / interval), new_drain - now, -1, drain - now}
end
return {1, free, drain - now, -1, drain - now}
