-- sliding_window: two-counter estimate (Cloudflare):
--   estimate = previous * (window - elapsed) / window + current
-- State: integer counters in key..':'..window_index for this and the previous window.
-- The Rust in-memory engine evaluates the very same floating-point expression.
-- `shift` (the 7th argument, "" for none): added to `now`, as in fixed_window.lua.
-- (defined once per script, not per call: a closure made on every call costs Redis more
-- than passing the policy's values)
local function sw_fits(p, c, e, window, limit, cost)
  return p * (window - e) / window + c + cost <= limit
end

local function sw_remaining(p, c, e, window, limit)
  local r = math.floor(limit - (p * (window - e) / window + c))
  if r < 0 then r = 0 end
  return r
end

-- `m` (prelude.lua's memo, batch calls only): [3] now, [4] window, [5] elapsed, [6] and
-- [7] this and the previous index formatted, [8] the span [9] was formatted for, [9] the
-- TTL argument
ALGO.sw = function(key, now, limit, window, cost, peek, shift, st, m)
  if shift ~= '' then now = now + tonumber(shift) end
  local elapsed, ckey, pkey
  if m then
    if m[3] ~= now or m[4] ~= window then
      local idx = math.floor(now / window)
      m[3], m[4], m[5], m[6], m[7] = now, window, now - idx * window, int(idx), int(idx - 1)
    end
    elapsed, ckey, pkey = m[5], key .. ':' .. m[6], m[7]
  else
    local idx = math.floor(now / window)
    elapsed, ckey, pkey = now - idx * window, key .. ':' .. int(idx), idx - 1
  end
  local cur, prev
  if st and st[1] then
    cur, prev = st[1], st[2]
  else
    local both = rcall('MGET', ckey, key .. ':' .. (m and pkey or int(pkey)))
    -- (`+ 0`: as tonumber reads them, for half its instructions)
    cur = (both[1] or 0) + 0
    prev = (both[2] or 0) + 0
    if st then st[1], st[2] = cur, prev end
  end
  -- time until both counters have aged out
  local reset
  if cur > 0 then reset = 2 * window - elapsed elseif prev > 0 then reset = window - elapsed else reset = 0 end
  if cost > limit then
    return 0, sw_remaining(prev, cur, elapsed, window, limit), reset, -1, 0
  end
  if sw_fits(prev, cur, elapsed, window, limit, cost) then
    if not peek then
      if cost == 1 then rcall('INCR', ckey) else rcall('INCRBY', ckey, int(cost)) end
      -- the counter expires at the end of the next window, set once when it is created
      if cur == 0 then
        local span = 2 * window - elapsed
        if m == nil then
          rcall('PEXPIRE', ckey, int(math.ceil(span / 1000)))
        else
          if m[8] ~= span then m[8], m[9] = span, int(math.ceil(span / 1000)) end
          rcall('PEXPIRE', ckey, m[9])
        end
      end
      cur = cur + cost
      reset = 2 * window - elapsed
    end
    return 1, sw_remaining(prev, cur, elapsed, window, limit), reset, -1, 0
  end
  -- Denied: the earliest offset where the same cost fits with no other traffic. `fits` only
  -- grows with the offset (every operation in it is monotone, rounding too), so the first
  -- offset that fits is found by bisection: ~40 steps, where a walk of one µs at a time
  -- took millions when the previous window's weight was below the limit's rounding.
  local function first_fit(p, c, lo, hi)
    -- the smallest e in [lo, hi] with fits(p, c, e); hi when none is smaller
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if sw_fits(p, c, mid, window, limit, cost) then hi = mid else lo = mid + 1 end
    end
    return lo
  end
  local retry
  if cur + cost <= limit then
    -- in this window, once the previous window's weight has decayed (prev > 0 here)
    retry = first_fit(prev, cur, elapsed + 1, window) - elapsed
  else
    -- in the next window, where this window's count becomes the previous one
    retry = window - elapsed + first_fit(cur, 0, 0, window)
  end
  return 0, sw_remaining(prev, cur, elapsed, window, limit), reset, retry, 0
end

if REFUND then -- only the refund scripts give units back
  REFUND.sw = function(key, now, window, cost, shift)
    if shift ~= '' then now = now + tonumber(shift) end
    local ckey = key .. ':' .. int(math.floor(now / window))
    local cur = tonumber(rcall('GET', ckey) or '0')
    if cur > 0 then
      rcall('DECRBY', ckey, math.min(cost, cur))
    end
  end
end
