-- leaky_bucket as a shaper: a queue that drains at a steady rate. The state is one
-- integer, the time (µs) at which the queue is empty again. An admitted request is told
-- how long to wait (delay) for its slot; one that would overflow the queue is denied.
-- `limit` is the queue size in units, `period` the leak interval (µs per unit).
ALGO.lb = function(key, now, capacity, interval, cost, peek)
  local drain = tonumber(redis.call('GET', key) or '0')
  if drain < now then drain = now end
  local queue = capacity * interval
  -- (a drain time more than `queue` ahead, after the clock went back: no room)
  local free = math.max(math.floor((queue - (drain - now)) / interval), 0)
  if cost > capacity then
    return {0, free, drain - now, -1, 0}
  end
  local new_drain = drain + cost * interval
  if new_drain - now > queue then
    return {0, free, drain - now, new_drain - queue - now, 0}
  end
  if peek then
    return {1, free, drain - now, -1, drain - now}
  end
  redis.call('SET', key, int(new_drain), 'PX', math.ceil((new_drain - now) / 1000))
  return {1, math.floor((queue - (new_drain - now)) / interval), new_drain - now, -1, drain - now}
end

if REFUND then -- only the layered and refund scripts give units back
  REFUND.lb = function(key, now, interval, cost)
    local drain = tonumber(redis.call('GET', key) or '0')
    local back = drain - cost * interval
    if back <= now then
      redis.call('DEL', key)
    else
      redis.call('SET', key, int(back), 'PX', math.ceil((back - now) / 1000))
    end
  end
end
