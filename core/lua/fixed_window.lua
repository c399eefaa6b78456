-- fixed_window: at most `limit` units per aligned window of `period` µs.
-- State: an integer counter in key..':'..window_index, expiring at the window's end.
-- `shift` (the 7th argument, "" for none) is added to `now` so that the key's windows are
-- offset per key (`"window_offset": "per_key"`, core/src/policy/offset.rs).
ALGO.fw = function(key, now, limit, window, cost, peek, shift)
  if shift ~= '' then now = now + tonumber(shift) end
  local idx = math.floor(now / window)
  local ckey = key .. ':' .. int(idx)
  local used = tonumber(redis.call('GET', ckey) or '0')
  local reset = (idx + 1) * window - now
  if cost > limit then
    return {0, math.max(limit - used, 0), reset, -1, 0}
  end
  if used + cost > limit then
    -- the next window starts empty and cost <= limit, so it fits there
    return {0, math.max(limit - used, 0), reset, reset, 0}
  end
  if not peek then
    -- (numbers handed to redis.call are formatted, which costs more than the call's INCR)
    if cost == 1 then redis.call('INCR', ckey) else redis.call('INCRBY', ckey, int(cost)) end
    -- a counter gets its expiry when the window's first units create it; later increments
    -- keep it (one call fewer per admitted check)
    if used == 0 then redis.call('PEXPIRE', ckey, int(math.ceil(reset / 1000))) end
    used = used + cost
  end
  return {1, limit - used, reset, -1, 0}
end

if REFUND then -- only the layered and refund scripts give units back
  REFUND.fw = function(key, now, window, cost, shift)
    if shift ~= '' then now = now + tonumber(shift) end
    local ckey = key .. ':' .. int(math.floor(now / window))
    local used = tonumber(redis.call('GET', ckey) or '0')
    if used > 0 then
      redis.call('DECRBY', ckey, math.min(cost, used))
    end
  end
end
