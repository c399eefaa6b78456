-- shardlimit: one check, with the block list and automatic blocking. Shared by main_check
-- (one check per call) and main_batch (many checks of one algorithm per call).
-- check(state, entry, denials, now, cost, extra, need, code, limit, period, mode, after,
--       within, dur, reason, okey, ov):
-- state    the algorithm's state key
-- entry    the key's block-list entry (any value; PTTL -1 = permanent)
-- denials  the policy's denial counter for this key (automatic blocking)
-- now      now in µs, or "0" for the server clock (TIME, read once per script call)
-- cost     units asked for
-- extra    the algorithm's extra argument (prelude.lua): a concurrency lease id, a
--          window's per-key shift, an exact bucket interval's denominator, or ""
-- need     grant mode: the fewest units worth admitting (the request's own cost)
-- code     algorithm code (fw, sw, sl, tb, lb, cc)
-- limit, period (µs)
-- mode     "check"; "peek" (never writes); "grant" (admit min(cost, available) units, at
--          least `need`: local admission reserves a batch this way)
-- after    block after this many denials (0 = never), counted `within` ms, for `dur` ms,
--          with `reason` stored in the block entry
-- okey     the key's override entry for this policy ("<version> <limit>", see overrides.rs)
-- ov       the override version the client decided with: "-" (the policy takes no
--          overrides: okey is not read), "" (none), or the version it has cached
-- Returns {allowed, remaining, reset_after_us, retry_after_us (-1 = absent), delay_us,
--          blocked (0 no, 1 blocked, 2 blocked by this very denial), units admitted}, or
--          {'o', entry, 0} when the key's override is not the one the client sent (entry
--          "" when it has none): nothing was decided, the client checks again with it.
--          (The 0 keeps an integer before the tag the main appends, so that a reply of
--          this shape is only ever taken with its call's tag: see `untag`.)
local server_now
local function check(state, entry, denials, now, cost, extra, need, code, limit, period, mode,
                     after, within, dur, reason, okey, ov)
  if ov ~= '-' then
    local changed = override_changed(okey, ov, 0) -- (override.lua)
    if changed then return changed end
  end
  if now == '0' then
    if server_now == nil then server_now = clock('0') end
    now = server_now
  else
    now = tonumber(now)
  end
  local ttl = redis.call('PTTL', entry)
  if ttl ~= -2 then
    if ttl == -1 then return {0, 0, 0, -1, 0, 1, 0} end
    return {0, 0, ttl * 1000, ttl * 1000, 0, 1, 0}
  end
  local fn = ALGO[code]
  limit, period, cost = tonumber(limit), tonumber(period), tonumber(cost)
  local r
  if mode == 'grant' then
    need = tonumber(need)
    r = fn(state, now, limit, period, need, true, extra)
    if r[1] == 1 then
      -- r[2] is what is available now; take up to `cost` of it, at least `need`
      local g = math.max(need, math.min(cost, r[2]))
      r = fn(state, now, limit, period, g, false, extra)
      if r[1] == 1 then r[7] = g end
    end
  else
    r = fn(state, now, limit, period, cost, mode == 'peek', extra)
    if r[1] == 1 and mode ~= 'peek' then r[7] = cost end
  end
  r[6] = 0
  if r[7] == nil then r[7] = 0 end
  -- (after is a decimal integer: "0" when the policy blocks nothing)
  if r[1] == 0 and mode ~= 'peek' and after ~= '0' then
    after = tonumber(after)
    local n = redis.call('INCR', denials)
    if n == 1 then redis.call('PEXPIRE', denials, within) end
    if n >= after then
      redis.call('SET', entry, reason, 'PX', dur)
      redis.call('DEL', denials)
      r[6] = 2
    end
  end
  return r
end
