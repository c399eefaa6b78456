-- token_bucket as GCRA: the whole state is one integer, the theoretical arrival time
-- (TAT, µs): the bucket is full again at TAT. Starts full, refills continuously.
-- `period` is the emission interval: µs per token.
ALGO.tb = function(key, now, capacity, interval, cost, peek)
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  local burst = capacity * interval
  -- (a TAT more than `burst` ahead, after the clock went back: nothing is available)
  local available = math.max(math.floor((burst - (tat - now)) / interval), 0)
  if cost > capacity then
    return {0, available, tat - now, -1, 0}
  end
  local new_tat = tat + cost * interval
  if new_tat - now > burst then
    return {0, available, tat - now, new_tat - burst - now, 0}
  end
  if peek then
    return {1, available, tat - now, -1, 0}
  end
  redis.call('SET', key, int(new_tat), 'PX', math.ceil((new_tat - now) / 1000))
  return {1, math.floor((burst - (new_tat - now)) / interval), new_tat - now, -1, 0}
end

-- GCRA state of both buckets: move the TAT back by the refunded units.
if REFUND then -- only the layered and refund scripts give units back
  REFUND.tb = function(key, now, interval, cost)
    local tat = tonumber(redis.call('GET', key) or '0')
    local back = tat - cost * interval
    if back <= now then
      redis.call('DEL', key)
    else
      redis.call('SET', key, int(back), 'PX', math.ceil((back - now) / 1000))
    end
  end
end
