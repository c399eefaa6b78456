-- leaky_bucket as a shaper: a queue that drains at a steady rate. The state is one
-- integer, the time (µs) at which the queue is empty again. An admitted request is told
-- how long to wait (delay) for its slot; one that would overflow the queue is denied.
-- `limit` is the queue size in units, `period` the leak interval (µs per unit); or, when
-- `q` (the 7th argument) is not "", interval/q µs per unit exactly (as in token_bucket.lua).
ALGO.lb = function(key, now, capacity, interval, cost, peek, q)
  if q ~= '' then
    -- an exact interval of interval/q µs (core/src/policy/precision.rs), step for step as
    -- core/src/engine/exact.rs: the state is "T:f", the TAT T + f/q µs; the arithmetic runs
    -- in ticks of 1/q µs counted from now, every value an integer below 2^53
    q = tonumber(q)
    local function div(a, b) -- floor(a / b) and a % b, exactly (a double quotient can round)
      local x = math.floor(a / b)
      local r = a - x * b
      if r < 0 then return x - 1, r + b elseif r >= b then return x + 1, r - b end
      return x, r
    end
    local function up(t) -- whole µs, rounded up
      local x, r = div(t, q)
      if r > 0 then x = x + 1 end
      return x
    end
    local d = 0
    local v = redis.call('GET', key)
    if v then
      local t, f = string.match(v, '^(%d+):(%d+)$')
      t, f = tonumber(t), tonumber(f)
      if not t or f >= q then error('shardlimit: unreadable exact bucket state in ' .. key) end
      -- (at most 2^52 ticks ahead: only a clock gone back that far reaches it)
      if t >= now then d = math.min(t - now, (div(4503599627370496, q))) * q + f end
    end
    local burst = capacity * interval
    local available = 0
    if d < burst then available = div(burst - d, interval) end
    if cost > capacity then return {0, available, up(d), -1, 0} end
    local nd = d + cost * interval
    if nd > burst then return {0, available, up(d), up(nd - burst), 0} end
    if peek then return {1, available, up(d), -1, up(d)} end
    local t, f = div(nd, q)
    redis.call('SET', key, int(now + t) .. ':' .. int(f), 'PX', math.ceil(up(nd) / 1000))
    return {1, div(burst - nd, interval), up(nd), -1, up(d)}
  end
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
  REFUND.lb = function(key, now, interval, cost, q)
    if q ~= '' then
      -- exact interval/q (see ALGO.lb): move the drain time back by cost × interval ticks
      q = tonumber(q)
      local v = redis.call('GET', key)
      local t, f
      if v then t, f = string.match(v, '^(%d+):(%d+)$') end
      t, f = tonumber(t), tonumber(f)
      if not t or f >= q or t < now then return end
      local back = (t - now) * q + f - cost * interval
      if back <= 0 then
        redis.call('DEL', key)
      else
        local x = math.floor(back / q) -- exactly, as div() in ALGO.lb
        local r = back - x * q
        if r < 0 then x, r = x - 1, r + q elseif r >= q then x, r = x + 1, r - q end
        local us = x
        if r > 0 then us = us + 1 end
        redis.call('SET', key, int(now + x) .. ':' .. int(r), 'PX', math.ceil(us / 1000))
      end
      return
    end
    local drain = tonumber(redis.call('GET', key) or '0')
    local back = drain - cost * interval
    if back <= now then
      redis.call('DEL', key)
    else
      redis.call('SET', key, int(back), 'PX', math.ceil((back - now) / 1000))
    end
  end
end
