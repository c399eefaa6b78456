-- concurrency: at most `limit` units held at once. One sorted-set member per lease,
-- "<lease>*<units>", scored by its expiry (µs); the member "#", scored -(1 + units held),
-- keeps the sum of the leases' units, so no call depends on a lease's size. Every call
-- (a peek too: it changes no decision) reclaims the leases that expired, at most
-- CC_EXPIRE of them, earliest first: when more expire at once, the rest count as held
-- until later calls reclaim them (later admissions, never more). A denied check's
-- retry_after walks at most CC_WALK live leases, earliest expiry first (when more would
-- have to expire, it is the time every current lease has expired: later than the exact
-- time, never earlier). core/src/engine/algo.rs mirrors every step. `period` is the lease TTL.
--
-- Tombstones: the release of a late lease (an acquire that missed its deadline, released by
-- the client: the acquire can reach Redis after that release) that finds no lease leaves the
-- lease's member scored -2^53 + (its expiry, µs), one lease TTL after the release: below
-- every score the calls read ("#" is at least -(1 + 10^12), CC_BAND is below it), so only
-- the acquire of that very lease meets it. That acquire's ZADD (LT: a lower score is kept)
-- leaves the tombstone in place and counts the member as not new, the rare path that
-- already reads the member: it is refused (retry_after -2, "released already"), grants
-- nothing and removes the tombstone. A normal acquire makes no extra call. The release that
-- leaves one first removes the tombstones that expired (each lives one lease TTL) and keeps
-- the key alive as long as the new one.
local CC_WALK = 64
local CC_EXPIRE = 128
local CC_EXPIRE_1 = '129' -- CC_EXPIRE + 1, as the argument (a number is formatted per call)
local CC_BAND = -4503599627370496 -- -2^52: every tombstone (CC_TOMB) is below, "#" above

-- units of a lease member ("id*units"; a member of an older version held one unit)
local function cc_units(m)
  local u = string.match(m, '%*(%d+)$')
  if u then return u + 0 end -- (as tonumber, for half its instructions)
  return 1
end

local function cc_store(key, held)
  if held <= 0 and rcall('ZCARD', key) <= 1 then
    rcall('DEL', key)
  else
    rcall('ZADD', key, -(math.max(held, 0) + 1), '#')
  end
end

-- units held after reclaiming expired leases, and whether "#" was there. One read gives
-- both: "#" (scored below 0) comes before every lease that expired (scored by expiry > 0)
local function cc_held(key, now, snow)
  local r = rcall('ZRANGEBYSCORE', key, '-4503599627370496', snow, 'WITHSCORES', 'LIMIT', '0',
    CC_EXPIRE_1)
  local held, from, sum = nil, 1, r[1] == '#'
  if sum then
    held = -r[2] - 1
    from = 3
  else
    held = rcall('ZCARD', key) -- none yet, or an older version's member per unit
  end
  local last = math.min(#r, from + 2 * CC_EXPIRE - 2)
  if last >= from then
    local gone = {}
    for i = from, last, 2 do
      gone[#gone + 1] = r[i]
      held = held - cc_units(r[i])
    end
    rcall('ZREM', key, unpack(gone))
    cc_store(key, held)
    sum = true
  end
  return math.max(held, 0), sum
end

-- time until the last lease expires (a function per script, not a closure per call)
local function cc_reset_after(key, now)
  local last = rcall('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  local t = last[2]
  if t == nil then return 0 end
  t = t + 0 -- (as tonumber, for half its instructions)
  if t <= now then return 0 end
  return t - now
end

-- `m` (prelude.lua's memo, batch calls only): [3] now, [4] ttl, then formatted [5] now,
-- [6] now + ttl, [7] the TTL in ms
ALGO.cc = function(key, now, max, ttl, cost, peek, lease, st, m)
  -- now, a lease's expiry and the key's TTL (ms), formatted once (a batch call's checks of
  -- one policy share them: formatting costs Redis ~2k instructions each)
  local snow, sexp, sttl
  if m then
    if m[3] ~= now or m[4] ~= ttl then
      m[3], m[4], m[5], m[6], m[7] = now, ttl, int(now), int(now + ttl), int(math.ceil(ttl / 1000))
    end
    snow, sexp, sttl = m[5], m[6], m[7]
  else
    snow = int(now)
  end
  -- (a peek reclaims the expired leases: a call after it would find none to reclaim)
  local n, sum
  if st and st[1] then
    n, sum = st[1], st[2]
  else
    n, sum = cc_held(key, now, snow)
    if st then st[1], st[2] = n, sum end
  end
  if cost > max then
    return 0, math.max(max - n, 0), cc_reset_after(key, now), -1, 0
  end
  if n + cost > max then
    -- with no releases, the k-th earliest expiring unit frees enough
    local k = n + cost - max
    local first = rcall('ZRANGEBYSCORE', key, '(' .. snow, '+inf', 'WITHSCORES',
      'LIMIT', 0, CC_WALK)
    local at = cc_reset_after(key, now) + now
    for i = 1, #first, 2 do
      k = k - cc_units(first[i])
      if k <= 0 then
        at = tonumber(first[i + 1])
        break
      end
    end
    return 0, math.max(max - n, 0), cc_reset_after(key, now), at - now, 0
  end
  if not peek then
    local member = lease .. '*' .. (cost == 1 and '1' or int(cost))
    if sexp == nil then sexp, sttl = int(now + ttl), int(math.ceil(ttl / 1000)) end
    if n + cost > 0 then
      -- the lease and the sum in one ZADD, the lease taken as new; its count says if it
      -- was (a lease acquired again keeps the units it holds: "#" is written again, and
      -- its expiry, which LT kept if later). LT writes "#" (its score only goes down here)
      -- and keeps a tombstone (scored below any expiry).
      local added = rcall('ZADD', key, 'LT', sexp, member, int(-(n + cost + 1)),
        '#')
      if sum then added = added + 1 end
      if added < 2 then
        -- (inline, as below: a local function is a closure made on every call)
        local e = rcall('ZSCORE', key, member)
        if e and tonumber(e) < CC_BAND then
          -- released before it ran: nothing granted, the tombstone gone
          rcall('ZREM', key, member)
          cc_store(key, n)
          return 0, math.max(max - n, 0), 0, -2, 0
        end
        rcall('ZADD', key, sexp, member, -(math.max(n, 0) + 1), '#')
      else
        n = n + cost
      end
    else
      local e = rcall('ZSCORE', key, member)
      if e and tonumber(e) < CC_BAND then
        rcall('ZREM', key, member)
        cc_store(key, n)
        return 0, math.max(max - n, 0), 0, -2, 0
      end
      if e == false then n = n + cost end
      rcall('ZADD', key, sexp, member)
      cc_store(key, n)
    end
    rcall('PEXPIRE', key, sttl)
  end
  return 1, max - n, cc_reset_after(key, now), -1, 0
end

if REFUND then -- only the refund and release scripts give units back
  local CC_TOMB = -9007199254740992 -- -2^53: a tombstone's score is this plus its expiry
  -- gives back lease `lease` of `cost` units; 1 when it was held at `now`. A lease not
  -- found leaves a tombstone for `ttl` µs (none when ttl is 0, as every release but that
  -- of a late lease has it): its acquire may yet run.
  REFUND.cc = function(key, now, ttl, cost, lease)
    local member = lease .. '*' .. int(cost)
    local e = rcall('ZSCORE', key, member)
    if e == false then
      if ttl > 0 then
        -- (inline: a local function is a closure made on every call)
        rcall('ZREMRANGEBYSCORE', key, '-inf', int(CC_TOMB + now)) -- the expired ones
        if rcall('ZSCORE', key, '#') == false then
          -- no sum yet (no key, or an older version's members, a unit each): one is
          -- written, so that no call counts the tombstone as a lease
          rcall('ZADD', key, -(rcall('ZCARD', key) + 1), '#')
        end
        rcall('ZADD', key, int(CC_TOMB + math.min(now + ttl, -CC_BAND - 1)), member)
        local ms = math.ceil(ttl / 1000)
        if rcall('PTTL', key) < ms then rcall('PEXPIRE', key, ms) end
      end
      return 0
    end
    if tonumber(e) < CC_BAND then return 0 end -- released before: its tombstone stays
    rcall('ZREM', key, member)
    local t = rcall('ZSCORE', key, '#')
    local held
    if t then held = -tonumber(t) - 1 - cost else held = rcall('ZCARD', key) end
    cc_store(key, held)
    if tonumber(e) <= now then return 0 end
    return 1
  end
end
