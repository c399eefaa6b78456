-- sliding_log: exact, with weighted entries. One sorted-set member per admitted check,
-- scored by the time (µs) it was recorded at and named "<before>:<cost>": `before` is the
-- number of units recorded on this key before it (mod 2^52, 16 digits, zero-padded so that
-- members of one score sort by it). A unit counts while its time > now - window, so the
-- live units are the units recorded from the oldest live entry on: newest's before + cost
-- minus oldest live's before, found in O(log N) whatever the cost or the number of entries.
-- A check is recorded at max(now, the newest entry's time) (one more µs when `before`
-- wraps), so that `before` grows with the score. A write removes at most SL_EXPIRE expired
-- entries (they no longer count; the key's PEXPIRE drops the rest); the walk to the unit
-- that must expire before a denied check fits is a binary search. core/src/engine/algo.rs
-- mirrors every step.
local SL_MOD = 4503599627370496 -- 2^52
local SL_EXPIRE = 64

-- entry at `rank`: time, before, cost; nil when there is none or it is not ours (a member
-- of another format: state written by an older version)
local function sl_parse(e)
  if e[1] == nil then return nil end
  local b, c = string.match(e[1], '^(%d+):(%d+)$')
  if b == nil then return nil end
  -- (`+ 0`: as tonumber reads them, for half its instructions)
  return e[2] + 0, b + 0, c + 0
end

local function sl_entry(key, rank)
  return sl_parse(rcall('ZRANGE', key, rank, rank, 'WITHSCORES'))
end

-- time until the entry recorded at `t` expires (0 for none): a function per script, not
-- a closure per call
local function sl_reset_after(t, window, now)
  if t == nil then return 0 end
  local r = t + window - now
  if r < 0 then r = 0 end
  return r
end

ALGO.sl = function(key, now, limit, window, cost, peek)
  local horizon = int(now - window)
  -- the oldest entry first: when it is live, none expired, and it is the base (the common
  -- case reads two entries); only when it expired are the entries counted. `total` nil:
  -- not counted (some, none expired)
  local oldest = rcall('ZRANGE', key, '0', '0', 'WITHSCORES')
  local total, expired = 0, 0
  local n, top, newest, nb, nc, base = 0, 0, nil, 0, 0, 0
  if oldest[1] ~= nil then
    total = nil
    if oldest[2] + 0 <= now - window then
      total = rcall('ZCARD', key)
      expired = rcall('ZCOUNT', key, '-inf', horizon)
    end
    newest, nb, nc = sl_entry(key, '-1')
    local ok = newest ~= nil
    if ok and (total == nil or expired < total) then
      local _
      if expired == 0 then _, base = sl_parse(oldest) else _, base = sl_entry(key, expired) end
      ok = base ~= nil
    end
    if not ok then
      -- not a state this script wrote: start afresh (UNLINK frees a large one off-thread)
      if not peek then rcall('UNLINK', key) end
      total, expired, newest = 0, 0, nil
    else
      top = (nb + nc) % SL_MOD
      if total == nil or expired < total then n = (top - base) % SL_MOD end
    end
  end
  if cost > limit then
    return 0, math.max(limit - n, 0), sl_reset_after(newest, window, now), -1, 0
  end
  if n + cost > limit then
    -- the k-th oldest live unit must expire first: the first live entry whose units
    -- bring the count from `base` to k (binary search over ranks; the newest qualifies)
    local k = n + cost - limit
    if total == nil then total = rcall('ZCARD', key) end
    local lo, hi = expired, total - 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local _, b, c = sl_entry(key, mid)
      if b ~= nil and (b + c - base) % SL_MOD >= k then hi = mid else lo = mid + 1 end
    end
    local t = sl_entry(key, lo) or newest
    return 0, math.max(limit - n, 0), sl_reset_after(newest, window, now), t + window - now, 0
  end
  if peek then
    return 1, limit - n, sl_reset_after(newest, window, now), -1, 0
  end
  if expired > 0 then
    rcall('ZREMRANGEBYRANK', key, 0, math.min(expired, SL_EXPIRE) - 1)
  end
  local at = now
  if newest ~= nil and newest > at then at = newest end
  if newest ~= nil and top < nb and at == newest then at = at + 1 end
  rcall('ZADD', key, int(at), string.format('%016d:%d', top, cost))
  rcall('PEXPIRE', key, int(math.ceil((at + window - now) / 1000)))
  return 1, limit - n - cost, at + window - now, -1, 0
end

if REFUND then -- only the refund scripts give units back
  -- The check being refunded is the newest entry recorded at or after `now` with this
  -- cost (the refund follows its admission by one round trip). Removing the newest entry
  -- is exact; an entry with newer ones after it keeps being counted in theirs (`before`),
  -- so its units stay counted until the entry before it expires: never more admitted.
  REFUND.sl = function(key, now, window, cost)
    local es = rcall('ZREVRANGEBYSCORE', key, '+inf', int(now), 'LIMIT', 0, SL_EXPIRE)
    for _, m in ipairs(es) do
      local c = string.match(m, '^%d+:(%d+)$')
      if c ~= nil and tonumber(c) == cost then
        rcall('ZREM', key, m)
        return
      end
    end
  end
end
