-- shardlimit: token bucket as GCRA. The whole state is one integer, the theoretical
-- arrival time (TAT, µs): the bucket is full again at TAT. Starts full, refills continuously.
-- KEYS[1]  the TAT key
-- ARGV[1]  now in microseconds, or "0" to read the server clock (TIME)
-- ARGV[2]  capacity         ARGV[3] emission interval: µs per token
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
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local burst = capacity * interval
local available = math.floor((burst - (tat - now)) / interval)
if cost > capacity then
  return {0, available, tat - now, -1, 0}
end
local new_tat = tat + cost * interval
if new_tat - now > burst then
  return {0, available, tat - now, new_tat - burst - now, 0}
end
if ARGV[5] == '1' then
  return {1, available, tat - now, -1, 0}
end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return {1, math.floor((burst - (new_tat - now)) / interval), new_tat - now, -1, 0}
