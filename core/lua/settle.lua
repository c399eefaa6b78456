-- settle: charge (consume without ever denying: the key may go into debt) and give back
-- (refund) per algorithm, for main_settle.lua (one script per algorithm: only the
-- algorithm the script holds gets its functions defined, a closure costs ~2 us a call). core/src/engine/settle.rs mirrors every step.
-- A key's debt is capped at one limit: what a window counts, a sliding log holds or a
-- bucket is filled to never exceeds twice the limit, so one huge charge cannot lock a key
-- out for more than about two periods, and every reply stays a plausible duration.
-- CHARGE.<code>(key, now, limit, period, cost, x)
-- GIVE.<code>(key, now, limit, period, cost, at, reserved, x): give back `cost` units; with
--   `reserved` > 0 they are units of a reservation of `reserved` units recorded at `at`
--   (µs): a window gives them back to the window that admitted them (nothing once that
--   window no longer counts), a sliding log to the entry it recorded. With `reserved` 0:
--   the current window's units, the sliding log's newest entries.
-- `x` is the algorithm's 7th argument as a check passes it ("" for none): a window's per-key
-- shift, added to `now` and `at` (core/src/policy/offset.rs), or an exact bucket
-- interval's denominator (the state is then "T:f", see ALGO.tb).
local CHARGE, GIVE = {}, {}
-- the most entries a sliding-log give-back rewrites (see GIVE.sl)
local SL_SHIFT = 256

local function counter_charge(ckey, limit, cost, ttl_us)
  local used = tonumber(rcall('GET', ckey) or '0')
  local add = math.min(cost, 2 * limit - used)
  if add > 0 then
    rcall('INCRBY', ckey, add)
    if used == 0 then rcall('PEXPIRE', ckey, math.ceil(ttl_us / 1000)) end
  end
end

local function counter_give(ckey, cost)
  local used = tonumber(rcall('GET', ckey) or '0')
  if used > 0 then rcall('DECRBY', ckey, math.min(cost, used)) end
end

if ALGO.fw then -- each settle script holds one algorithm: define its functions only
CHARGE.fw = function(key, now, limit, window, cost, x)
  if x ~= '' then now = now + tonumber(x) end
  local idx = math.floor(now / window)
  counter_charge(key .. ':' .. int(idx), limit, cost, (idx + 1) * window - now)
end

GIVE.fw = function(key, now, limit, window, cost, at, reserved, x)
  if x ~= '' then now, at = now + tonumber(x), at + tonumber(x) end
  local idx = math.floor(at / window)
  if idx ~= math.floor(now / window) then return end -- that window is over
  counter_give(key .. ':' .. int(idx), cost)
end
end

if ALGO.sw then
CHARGE.sw = function(key, now, limit, window, cost, x)
  if x ~= '' then now = now + tonumber(x) end
  local idx = math.floor(now / window)
  counter_charge(key .. ':' .. int(idx), limit, cost, 2 * window - (now - idx * window))
end

GIVE.sw = function(key, now, limit, window, cost, at, reserved, x)
  if x ~= '' then now, at = now + tonumber(x), at + tonumber(x) end
  local idx = math.floor(at / window)
  -- the current window, or the previous one (whose weight is still counted)
  if idx + 1 < math.floor(now / window) then return end
  counter_give(key .. ':' .. int(idx), cost)
end
end

if ALGO.sl then
-- the sliding log's live units now: n, the newest entry (time, before, cost), its top;
-- ok false when the key holds a state this script did not write
local function sl_live(key, now, window)
  local total = rcall('ZCARD', key)
  local expired = rcall('ZCOUNT', key, '-inf', int(now - window))
  if total == 0 then return true, total, expired, 0, nil, 0, 0, 0 end
  local newest, nb, nc = sl_entry(key, -1)
  if newest == nil then return false end
  local base = 0
  if expired < total then
    local _
    _, base = sl_entry(key, expired)
    if base == nil then return false end
  end
  local top = (nb + nc) % SL_MOD
  local n = 0
  if expired < total then n = (top - base) % SL_MOD end
  return true, total, expired, n, newest, nb, nc, top
end

CHARGE.sl = function(key, now, limit, window, cost)
  local ok, total, expired, n, newest, nb, nc, top = sl_live(key, now, window)
  if not ok then
    rcall('UNLINK', key)
    total, expired, n, newest, nb, top = 0, 0, 0, nil, 0, 0
  end
  local add = math.min(cost, 2 * limit - n)
  if add <= 0 then return end
  if expired > 0 then
    rcall('ZREMRANGEBYRANK', key, 0, math.min(expired, SL_EXPIRE) - 1)
  end
  local at = now
  if newest ~= nil and newest > at then at = newest end
  if newest ~= nil and top < nb and at == newest then at = at + 1 end
  rcall('ZADD', key, int(at), string.format('%016d:%d', top, add))
  rcall('PEXPIRE', key, math.ceil((at + window - now) / 1000))
end

GIVE.sl = function(key, now, limit, window, cost, at, reserved)
  local ok, total, expired, n = sl_live(key, now, window)
  if not ok or n == 0 then return end
  if reserved == 0 then
    -- the newest units first: taking from the newest entry changes no other entry
    local left = math.min(cost, n)
    for _ = 1, SL_EXPIRE do
      if left <= 0 then return end
      local t, b, c = sl_entry(key, -1)
      if t == nil or t <= now - window then return end
      local m = string.format('%016d:%d', b, c)
      rcall('ZREM', key, m)
      if c > left then
        rcall('ZADD', key, int(t), string.format('%016d:%d', b, c - left))
        return
      end
      left = left - c
    end
    return
  end
  -- the reservation's entry: recorded at `at` with `reserved` units, still live; when a
  -- refund has taken from it since (refunds take the newest units), the newest entries
  -- recorded at `at` instead (entries of one instant expire together: which of them holds
  -- the units changes no decision)
  if at <= now - window then return end
  local ms = rcall('ZRANGEBYSCORE', key, int(at), int(at))
  if #ms == 0 then return end
  local cs = {}
  for k, m in ipairs(ms) do
    local _, mc = string.match(m, '^(%d+):(%d+)$')
    if mc == nil then return end
    cs[k] = tonumber(mc)
  end
  local gives, left, first = {}, math.min(cost, reserved), nil
  for k = 1, #ms do
    if cs[k] == reserved then gives[k], first = left, k break end
  end
  if first == nil then
    for k = #ms, 1, -1 do
      if left <= 0 then break end
      local g = math.min(left, cs[k])
      if g > 0 then gives[k], first, left = g, k, left - g end
    end
  end
  if first == nil then return end
  local rank = rcall('ZRANK', key, ms[first])
  -- every later entry counts these units in its `before`: shift them down by the units
  -- given back, at most SL_SHIFT of them (beyond, the units stay counted until the
  -- entry expires: never more admitted than the limit)
  if total - rank - 1 > SL_SHIFT then return end
  local later = rcall('ZRANGE', key, rank, -1, 'WITHSCORES')
  for i = 1, #later, 2 do
    if string.match(later[i], '^(%d+):(%d+)$') == nil then return end
  end
  local shift = 0
  for i = 1, #later, 2 do
    local g = gives[first + (i - 1) / 2] or 0
    if shift > 0 or g > 0 then
      local lb, lc = string.match(later[i], '^(%d+):(%d+)$')
      rcall('ZREM', key, later[i])
      if tonumber(lc) > g then
        rcall('ZADD', key, later[i + 1],
          string.format('%016d:%d', (tonumber(lb) - shift) % SL_MOD, tonumber(lc) - g))
      end
    end
    shift = shift + g
  end
end
end

-- an exact bucket's state "T:f" (see ALGO.tb) as ticks of 1/q µs ahead of now (0 when
-- passed, at most 2^52 ticks); nil when it is unreadable
local function exact_div(a, b) -- floor(a / b) and a % b, exactly, as div() in ALGO.tb
  local x = math.floor(a / b)
  local r = a - x * b
  if r < 0 then return x - 1, r + b elseif r >= b then return x + 1, r - b end
  return x, r
end

local function exact_ahead(key, now, q)
  local v = rcall('GET', key)
  if not v then return 0 end
  local t, f = string.match(v, '^(%d+):(%d+)$')
  t, f = tonumber(t), tonumber(f)
  if not t or f >= q then return nil end
  if t < now then return 0 end
  return math.min(t - now, (exact_div(4503599627370496, q))) * q + f
end

-- writes the exact state `d` ticks ahead of now (none when d is 0)
local function exact_set(key, now, q, d)
  if d <= 0 then
    rcall('DEL', key)
    return
  end
  local t, f = exact_div(d, q)
  local us = t
  if f > 0 then us = us + 1 end
  rcall('SET', key, int(now + t) .. ':' .. int(f), 'PX', math.ceil(us / 1000))
end

local function tat_charge(key, now, limit, interval, cost, x)
  if x ~= '' then
    local q = tonumber(x)
    local d = exact_ahead(key, now, q)
    if d == nil then error('shardlimit: unreadable exact bucket state in ' .. key) end
    local nd = math.max(math.min(d + cost * interval, 2 * limit * interval), d)
    if nd > d then exact_set(key, now, q, nd) end
    return
  end
  local tat = tonumber(rcall('GET', key) or '0')
  if tat < now then tat = now end
  local new = math.max(math.min(tat + cost * interval, now + 2 * limit * interval), tat)
  if new > now then
    rcall('SET', key, int(new), 'PX', math.ceil((new - now) / 1000))
  end
end

local function tat_give(key, now, limit, interval, cost, at, reserved, x)
  if x ~= '' then
    local q = tonumber(x)
    local d = exact_ahead(key, now, q)
    if d == nil then error('shardlimit: unreadable exact bucket state in ' .. key) end
    if d > 0 then exact_set(key, now, q, d - cost * interval) end
    return
  end
  local tat = tonumber(rcall('GET', key) or '0')
  local back = tat - cost * interval
  if back <= now then
    rcall('DEL', key)
  else
    rcall('SET', key, int(back), 'PX', math.ceil((back - now) / 1000))
  end
end

if ALGO.tb then CHARGE.tb, GIVE.tb = tat_charge, tat_give end
if ALGO.lb then CHARGE.lb, GIVE.lb = tat_charge, tat_give end
