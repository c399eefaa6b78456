-- sliding_log: exact. One sorted-set member per admitted unit, scored by its admission
-- time (µs); a unit counts while score > now - window.
ALGO.sl = function(key, now, limit, window, cost, peek)
  if not peek then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - window))
  end
  local n = redis.call('ZCOUNT', key, '(' .. int(now - window), '+inf')
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
    local skip = redis.call('ZCOUNT', key, '-inf', int(now - window))
    local k = n + cost - limit
    local e = redis.call('ZRANGE', key, skip + k - 1, skip + k - 1, 'WITHSCORES')
    return {0, limit - n, reset_after(), tonumber(e[2]) + window - now, 0}
  end
  if not peek then
    -- members must be unique: number them after the ones already stored at this instant
    local seq = redis.call('ZCOUNT', key, int(now), int(now))
    local args = {}
    for i = 1, cost do
      args[#args + 1] = int(now)
      args[#args + 1] = int(now) .. '-' .. int(seq + i)
    end
    for i = 1, #args, 7998 do
      redis.call('ZADD', key, unpack(args, i, math.min(i + 7997, #args)))
    end
    redis.call('PEXPIRE', key, math.ceil(window / 1000))
    n = n + cost
  end
  return {1, limit - n, reset_after(), -1, 0}
end

if REFUND then -- only the layered and refund scripts give units back
  REFUND.sl = function(key, now, window, cost)
    local members = redis.call('ZRANGEBYSCORE', key, int(now), int(now), 'LIMIT', 0, cost)
    if #members > 0 then
      redis.call('ZREM', key, unpack(members))
    end
  end
end
