-- concurrency: at most `limit` units held at once. Each held unit is a sorted-set member
-- lease..':'..i scored by its expiry (µs); expired leases are reclaimed on every call.
-- `period` is the lease TTL.
ALGO.cc = function(key, now, max, ttl, cost, peek, lease)
  if not peek then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  end
  local n = redis.call('ZCOUNT', key, '(' .. int(now), '+inf')
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
    local skip = redis.call('ZCOUNT', key, '-inf', int(now))
    local k = n + cost - max
    local e = redis.call('ZRANGE', key, skip + k - 1, skip + k - 1, 'WITHSCORES')
    return {0, max - n, reset_after(), tonumber(e[2]) - now, 0}
  end
  if not peek then
    local expiry = int(now + ttl)
    for i = 1, cost do
      redis.call('ZADD', key, expiry, lease .. ':' .. i)
    end
    redis.call('PEXPIRE', key, math.ceil(ttl / 1000))
    n = n + cost
  end
  return {1, max - n, reset_after(), -1, 0}
end

if REFUND then -- only the layered and refund scripts give units back
  REFUND.cc = function(key, now, ttl, cost, lease)
    for i = 1, cost do
      redis.call('ZREM', key, lease .. ':' .. i)
    end
  end
end
