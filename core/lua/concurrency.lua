-- concurrency: at most `limit` units held at once. One sorted-set member per lease,
-- "<lease>*<units>", scored by its expiry (µs); the member "#", scored -(1 + units held),
-- keeps the sum of the leases' units, so no call depends on a lease's size. Every call
-- (a peek too: it changes no decision) reclaims the leases that expired, at most
-- CC_EXPIRE of them, earliest first: when more expire at once, the rest count as held
-- until later calls reclaim them (later admissions, never more). A denied check's
-- retry_after walks at most CC_WALK live leases, earliest expiry first (when more would
-- have to expire, it is the time every current lease has expired: later than the exact
-- time, never earlier). core/src/engine/algo.rs mirrors every step. `period` is the lease TTL.
local CC_WALK = 64
local CC_EXPIRE = 128
local CC_EXPIRE_1 = '129' -- CC_EXPIRE + 1, as the argument (a number is formatted per call)

-- units of a lease member ("id*units"; a member of an older version held one unit)
local function cc_units(m)
  local u = string.match(m, '%*(%d+)$')
  if u then return tonumber(u) end
  return 1
end

local function cc_store(key, held)
  if held <= 0 and redis.call('ZCARD', key) <= 1 then
    redis.call('DEL', key)
  else
    redis.call('ZADD', key, -(math.max(held, 0) + 1), '#')
  end
end

-- units held after reclaiming expired leases, and whether "#" was there. One read gives
-- both: "#" (scored below 0) comes before every lease that expired (scored by expiry > 0)
local function cc_held(key, now)
  local r = redis.call('ZRANGEBYSCORE', key, '-inf', int(now), 'WITHSCORES', 'LIMIT', '0',
    CC_EXPIRE_1)
  local held, from, sum = nil, 1, r[1] == '#'
  if sum then
    held = -tonumber(r[2]) - 1
    from = 3
  else
    held = redis.call('ZCARD', key) -- none yet, or an older version's member per unit
  end
  local last = math.min(#r, from + 2 * CC_EXPIRE - 2)
  if last >= from then
    local gone = {}
    for i = from, last, 2 do
      gone[#gone + 1] = r[i]
      held = held - cc_units(r[i])
    end
    redis.call('ZREM', key, unpack(gone))
    cc_store(key, held)
    sum = true
  end
  return math.max(held, 0), sum
end

-- time until the last lease expires (a function per script, not a closure per call)
local function cc_reset_after(key, now)
  local last = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  if last[2] == nil or tonumber(last[2]) <= now then return 0 end
  return tonumber(last[2]) - now
end

ALGO.cc = function(key, now, max, ttl, cost, peek, lease)
  local n, sum = cc_held(key, now)
  if cost > max then
    return {0, math.max(max - n, 0), cc_reset_after(key, now), -1, 0}
  end
  if n + cost > max then
    -- with no releases, the k-th earliest expiring unit frees enough
    local k = n + cost - max
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES',
      'LIMIT', 0, CC_WALK)
    local at = cc_reset_after(key, now) + now
    for i = 1, #first, 2 do
      k = k - cc_units(first[i])
      if k <= 0 then
        at = tonumber(first[i + 1])
        break
      end
    end
    return {0, math.max(max - n, 0), cc_reset_after(key, now), at - now, 0}
  end
  if not peek then
    local member = lease .. '*' .. (cost == 1 and '1' or int(cost))
    if n + cost > 0 then
      -- the lease and the sum in one ZADD, the lease taken as new; its count says if it
      -- was (a lease acquired again keeps the units it holds: "#" is written again)
      local added = redis.call('ZADD', key, int(now + ttl), member, int(-(n + cost + 1)), '#')
      if sum then added = added + 1 end
      if added < 2 then redis.call('ZADD', key, -(math.max(n, 0) + 1), '#') else n = n + cost end
    else
      if redis.call('ZSCORE', key, member) == false then n = n + cost end
      redis.call('ZADD', key, int(now + ttl), member)
      cc_store(key, n)
    end
    redis.call('PEXPIRE', key, int(math.ceil(ttl / 1000)))
  end
  return {1, max - n, cc_reset_after(key, now), -1, 0}
end

if REFUND then -- only the layered, refund and release scripts give units back
  -- gives back lease `lease` of `cost` units; 1 when it was held at `now`
  REFUND.cc = function(key, now, ttl, cost, lease)
    local member = lease .. '*' .. int(cost)
    local e = redis.call('ZSCORE', key, member)
    if e == false then return 0 end
    redis.call('ZREM', key, member)
    local t = redis.call('ZSCORE', key, '#')
    local held
    if t then held = -tonumber(t) - 1 - cost else held = redis.call('ZCARD', key) end
    cc_store(key, held)
    if tonumber(e) <= now then return 0 end
    return 1
  end
end
