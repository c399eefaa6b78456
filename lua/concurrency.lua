-- shardlimit: concurrency limit with leases. Each held unit is a sorted-set member
-- scored by its expiry (µs); expired leases are reclaimed on every call.
-- KEYS[1]  the sorted set
-- ARGV[1]  now in microseconds, or "0" to read the server clock (TIME)
-- ARGV[2]  max concurrent units   ARGV[3] lease ttl (µs)
-- ARGV[4]  cost (units held by this lease)   ARGV[5] "1" = peek (never writes)
-- ARGV[6]  lease id chosen by the client (members are id..':'..i)
-- Returns {allowed, remaining, reset_after_us, retry_after_us (-1 = absent), delay_us}
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local peek = ARGV[5] == '1'
local key = KEYS[1]
if not peek then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
end
local n = redis.call('ZCOUNT', key, string.format('(%d', now), '+inf')
local function reset_after()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] == nil or tonumber(last[2]) <= now then return 0 end
  return tonumber(last[2]) - now
end
if cost > max then
  return {0, math.max(max - n, 0), reset_after(), -1, 0}
end
if n + cost > max then
  -- with no releases, the (n + cost - max)-th earliest expiry frees enough units
  local skip = redis.call('ZCOUNT', key, '-inf', string.format('%d', now))
  local k = n + cost - max
  local e = redis.call('ZRANGE', key, skip + k - 1, skip + k - 1, 'WITHSCORES')
  return {0, max - n, reset_after(), tonumber(e[2]) - now, 0}
end
if not peek then
  local expiry = string.format('%d', now + ttl)
  for i = 1, cost do
    redis.call('ZADD', key, expiry, ARGV[6] .. ':' .. i)
  end
  redis.call('PEXPIRE', key, math.ceil(ttl / 1000))
  n = n + cost
end
return {1, max - n, reset_after(), -1, 0}
