-- fixed_window: at most `limit` units per aligned window of `period` µs.
-- State: an integer counter in key..':'..window_index, expiring at the window's end.
-- `shift` (the 7th argument, "" for none) is added to `now` so that the key's windows are
-- offset per key (`"window_offset": "per_key"`, core/src/policy/offset.rs).
-- `m` (prelude.lua's memo, batch calls only): [3] now, [4] window, [5] the index formatted,
-- [6] reset, [7] the reset [8] was formatted for, [8] the TTL argument
ALGO.fw = function(key, now, limit, window, cost, peek, shift, st, m)
  local used, ckey, reset
  if st and st[1] then
    used, ckey, reset = st[1], st[2], st[3]
  else
    if shift ~= '' then now = now + tonumber(shift) end
    if m then
      if m[3] ~= now or m[4] ~= window then
        local idx = math.floor(now / window)
        m[3], m[4], m[5], m[6] = now, window, int(idx), (idx + 1) * window - now
      end
      ckey, reset = key .. ':' .. m[5], m[6]
    else
      local idx = math.floor(now / window)
      ckey = key .. ':' .. int(idx)
      reset = (idx + 1) * window - now
    end
    used = (rcall('GET', ckey) or 0) + 0 -- (as tonumber, for half its instructions)
    if st then st[1], st[2], st[3] = used, ckey, reset end
  end
  if cost > limit then
    return 0, math.max(limit - used, 0), reset, -1, 0
  end
  if used + cost > limit then
    -- the next window starts empty and cost <= limit, so it fits there
    return 0, math.max(limit - used, 0), reset, reset, 0
  end
  if not peek then
    -- (numbers handed to redis.call are formatted, which costs more than the call's INCR)
    if cost == 1 then rcall('INCR', ckey) else rcall('INCRBY', ckey, int(cost)) end
    -- a counter gets its expiry when the window's first units create it; later increments
    -- keep it (one call fewer per admitted check)
    if used == 0 then
      if m == nil then
        rcall('PEXPIRE', ckey, int(math.ceil(reset / 1000)))
      else
        if m[7] ~= reset then m[7], m[8] = reset, int(math.ceil(reset / 1000)) end
        rcall('PEXPIRE', ckey, m[8])
      end
    end
    used = used + cost
  end
  return 1, limit - used, reset, -1, 0
end

if REFUND then -- only the refund scripts give units back
  REFUND.fw = function(key, now, window, cost, shift)
    if shift ~= '' then now = now + tonumber(shift) end
    local ckey = key .. ':' .. int(math.floor(now / window))
    local used = tonumber(rcall('GET', ckey) or '0')
    if used > 0 then
      rcall('DECRBY', ckey, math.min(cost, used))
    end
  end
end
