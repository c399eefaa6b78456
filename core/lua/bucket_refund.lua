-- shardlimit: the refund of both buckets (token_bucket.lua's REFUND.tb and
-- leaky_bucket.lua's REFUND.lb are this one function: the same GCRA state). Assembled
-- before the algorithm files in the scripts that take every algorithm (refund,
-- settle_multi); only where REFUND is a table is the function made.
-- bucket_refund(key, now, interval, cost, q): move the bucket's time (the token bucket's
-- TAT, the leaky bucket's drain time) back by the refunded units.
local bucket_refund
if REFUND then
  bucket_refund = function(key, now, interval, cost, q)
    if q ~= '' then
      -- exact interval/q (see the buckets' ALGO): move the time back by cost × interval ticks
      q = tonumber(q)
      local v = rcall('GET', key)
      local t, f
      if v then t, f = string.match(v, '^(%d+):(%d+)$') end
      t, f = tonumber(t), tonumber(f)
      if not t or f >= q or t < now then return end
      local back = (t - now) * q + f - cost * interval
      if back <= 0 then
        rcall('DEL', key)
      else
        local x = math.floor(back / q) -- exactly, as div() in the buckets' ALGO
        local r = back - x * q
        if r < 0 then x, r = x - 1, r + q elseif r >= q then x, r = x + 1, r - q end
        local us = x
        if r > 0 then us = us + 1 end
        rcall('SET', key, int(now + x) .. ':' .. int(r), 'PX', math.ceil(us / 1000))
      end
      return
    end
    local t = tonumber(rcall('GET', key) or '0')
    local back = t - cost * interval
    if back <= now then
      rcall('DEL', key)
    else
      rcall('SET', key, int(back), 'PX', math.ceil((back - now) / 1000))
    end
  end
end
