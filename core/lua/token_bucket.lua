-- token_bucket as GCRA: the whole state is one integer, the theoretical arrival time
-- (TAT, µs): the bucket is full again at TAT. Starts full, refills continuously.
-- `period` is the emission interval: µs per token; or, when `q` (the 7th argument) is not
-- "", interval/q µs per token exactly.
ALGO.tb = function(key, now, capacity, interval, cost, peek, q, st)
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
    if peek then return 1, available, up(d), -1, 0 end
    local t, f = div(nd, q)
    rcall('SET', key, int(now + t) .. ':' .. int(f), 'PX', int(math.ceil(up(nd) / 1000)))
    return 1, div(burst - nd, interval), up(nd), -1, 0
  end
  local tat
  if st and st[1] ~= nil then
    tat = st[1]
  else
    tat = (rcall('GET', key) or 0) + 0 -- (as tonumber, for half its instructions)
    if st then st[1] = tat end
  end
  if tat < now then tat = now end
  local burst = capacity * interval
  -- (a TAT more than `burst` ahead, after the clock went back: nothing is available)
  local available = math.max(math.floor((burst - (tat - now)) / interval), 0)
  if cost > capacity then
    return 0, available, tat - now, -1, 0
  end
  local new_tat = tat + cost * interval
  if new_tat - now > burst then
    return 0, available, tat - now, new_tat - burst - now, 0
  end
  if peek then
    return 1, available, tat - now, -1, 0
  end
  rcall('SET', key, int(new_tat), 'PX', int(math.ceil((new_tat - now) / 1000)))
  return 1, math.floor((burst - (new_tat - now)) / interval), new_tat - now, -1, 0
end

-- Its refund is the buckets' one (bucket_refund.lua).
if REFUND then REFUND.tb = bucket_refund end -- only the refund scripts give units back
