-- shardlimit: sliding log, exact. One sorted-set member per admitted unit, scored by
-- its admission time; a unit counts while score > now - window.
-- KEYS[1]  the sorted set
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
local peek = ARGV[5] == '1'
local key = KEYS[1]
if not peek then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - window))
end
local n = redis.call('ZCOUNT', key, string.format('(%d', now - window), '+inf')
local function reset_after()
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] == nil then return 0 end
  local r = tonumber(newest[2]) + window - now
  if r < 0 then r = 0 end
  return r
end
if cost > limit then
  return {0, math.max(limit - n, 0), reset_after(), -1, 0}
end
if n + cost > limit then
  -- the (n + cost - limit)-th oldest live unit must expire first
  local k = n + cost - limit
  local skip = redis.call('ZCOUNT', key, '-inf', string.format('%d', now - window))
  local e = redis.call('ZRANGE', key, skip + k - 1, skip + k - 1, 'WITHSCORES')
  return {0, limit - n, reset_after(), tonumber(e[2]) + window - now, 0}
end
if not peek then
  -- members must be unique: number them after the ones already stored at this instant
  local seq = redis.call('ZCOUNT', key, string.format('%d', now), string.format('%d', now))
  local args = {}
  for i = 1, cost do
    args[#args + 1] = string.format('%d', now)
    args[#args + 1] = string.format('%d-%d', now, seq + i)
  end
  for i = 1, #args, 7998 do
    redis.call('ZADD', key, unpack(args, i, math.min(i + 7997, #args)))
  end
  redis.call('PEXPIRE', key, math.ceil(window / 1000))
  n = n + cost
end
return {1, limit - n, reset_after(), -1, 0}
