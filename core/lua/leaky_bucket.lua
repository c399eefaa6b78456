-- leaky_bucket as a shaper: a queue that drains at a steady rate. The state is one
-- integer, the time (µs) at which the queue is empty again. An admitted request is told
-- how long to wait (delay) for its slot; one that would overflow the queue is denied.
-- `limit` is the queue size in units, `period` the leak interval (µs per unit); or, when
-- `q` (the 7th argument) is not "", interval/q µs per unit exactly (as in token_bucket.lua).
ALGO.lb = function(key, now, capacity, interval, cost, peek, q, st)
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
    local v
    if st and st[1] ~= nil then
      v = st[1]
    else
      v = rcall('GET', key)
      if st then st[1] = v end
    end
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
    if cost > capacity then return 0, available, up(d), -1, 0 end
    local nd = d + cost * interval
    if nd > burst then return 0, available, up(d), up(nd - burst), 0 end
    if peek then return 1, available, up(d), -1, up(d) end
    local t, f = div(nd, q)
    rcall('SET', key, int(now + t) .. ':' .. int(f), 'PX', int(math.ceil(up(nd) / 1000)))
    return 1, div(burst - nd, interval), up(nd), -1, up(d)
  end
  local drain
  if st and st[1] ~= nil then
    drain = st[1]
  else
    drain = (rcall('GET', key) or 0) + 0 -- (as tonumber, for half its instructions)
    if st then st[1] = drain end
  end
  if drain < now then drain = now end
  local queue = capacity * interval
  -- (a drain time more than `queue` ahead, after the clock went back: no room)
  local free = math.max(math.floor((queue - (drain - now)) / interval), 0)
  if cost > capacity then
    return 0, free, drain - now, -1, 0
  end
  local new_drain = drain + cost * interval
  if new_drain - now > queue then
    return 0, free, drain - now, new_drain - queue - now, 0
  end
  if peek then
    return 1, free, drain - now, -1, drain - now
  end
  rcall('SET', key, int(new_drain), 'PX', int(math.ceil((new_drain - now) / 1000)))
  return 1, math.floor((queue - (new_drain - now)) / interval), new_drain - now, -1, drain - now
end

-- Its refund is the buckets' one (bucket_refund.lua).
if REFUND then REFUND.lb = bucket_refund end -- only the refund scripts give units back
