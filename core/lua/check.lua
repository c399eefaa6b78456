-- shardlimit: one check, with the block list and automatic blocking. Shared by main_check
-- (one check per call) and main_batch (many checks of one algorithm per call).
-- check(state, entry, denials, now, cost, extra, need, code, limit, period, mode, after,
--       within, dur, reason, okey, ov):
-- state    the algorithm's state key
-- entry    the key's block-list entry (any value; PTTL -1 = permanent), or nil: the
--          policy reads no block list (then `after` is "0")
-- denials  the policy's denial counter for this key (automatic blocking; nil without)
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
  if entry then
    local ttl = rcall('PTTL', entry)
    if ttl ~= -2 then
      if ttl == -1 then return {0, 0, 0, -1, 0, 1, 0} end
      return {0, 0, ttl * 1000, ttl * 1000, 0, 1, 0}
    end
  end
  local fn = ALGO[code]
  limit, period, cost = tonumber(limit), tonumber(period), tonumber(cost)
  local r
  if mode == 'grant' then
    need = tonumber(need)
    r = {fn(state, now, limit, period, need, true, extra)}
    if r[1] == 1 then
      -- r[2] is what is available now; take up to `cost` of it, at least `need`
      local g = math.max(need, math.min(cost, r[2]))
      r = {fn(state, now, limit, period, g, false, extra)}
      if r[1] == 1 then r[7] = g end
    end
  else
    r = {fn(state, now, limit, period, cost, mode == 'peek', extra)}
    if r[1] == 1 and mode ~= 'peek' then r[7] = cost end
  end
  r[6] = 0
  if r[7] == nil then r[7] = 0 end
  -- (after is a decimal integer: "0" when the policy blocks nothing)
  if r[1] == 0 and mode ~= 'peek' and after ~= '0' then
    after = tonumber(after)
    local n = rcall('INCR', denials)
    if n == 1 then rcall('PEXPIRE', denials, within) end
    if n >= after then
      rcall('SET', entry, reason, 'PX', dur)
      rcall('DEL', denials)
      r[6] = 2
    end
  end
  return r
end

-- The layout of a check call (main_check, main_batch; written by CheckRequest::write in
-- core/src/engine/redis/protocol.rs): a check sends only what its policy uses, so a
-- feature the policy does not use costs no key, no argument and no call.
-- Keys, from KEYS[k]: the state key; the block-list entry (unless flag `u`); the denial
-- counter (flag `a`); the override entry (flag `o`).
-- Its own values, from ARGV[i]: cost; then, only when it has flags (a string of letters,
-- never a number), the flags and the values they name, in this order:
--   n now (µs; without it the server clock), x the algorithm's extra argument (without
--   it ""), g need (grant mode), p (peek mode, no value), o the override version; and
--   u (no block list), a (automatic blocking), which name no item value.
-- Its policy's values, from ARGV[s] (s nil: right after its own values): limit, period,
--   then with flag `a` after, within, dur, reason.
-- parse(k, i, s, code) returns the next key index, the next item index, then check()'s
-- arguments from `state` to `ov` (`code`: the script's algorithm).
local find = string.find
local function parse(k, i, s, code)
  local cost = ARGV[i]
  local flags = ARGV[i + 1]
  local state = KEYS[k]
  if string.byte(flags) <= 57 then -- a number: no flags (limit, or a batch's shape index)
    if s == nil then s = i + 1 end
    return k + 2, i + 1, state, KEYS[k + 1], nil, '0', cost, '', 0, code, ARGV[s],
      ARGV[s + 1], 'check', '0', nil, nil, nil, nil, '-'
  end
  k, i = k + 1, i + 2
  local entry, denials, okey
  if not find(flags, 'u', 1, true) then entry = KEYS[k]; k = k + 1 end
  local now, extra, need, mode, ov = '0', '', 0, 'check', '-'
  if find(flags, 'n', 1, true) then now = ARGV[i]; i = i + 1 end
  if find(flags, 'x', 1, true) then extra = ARGV[i]; i = i + 1 end
  if find(flags, 'g', 1, true) then
    mode, need = 'grant', ARGV[i]
    i = i + 1
  elseif find(flags, 'p', 1, true) then
    mode = 'peek'
  end
  if find(flags, 'o', 1, true) then ov = ARGV[i]; i = i + 1 end
  if s == nil then s = i end
  local after, within, dur, reason = '0'
  if find(flags, 'a', 1, true) then
    denials = KEYS[k]
    k = k + 1
    after, within, dur, reason = ARGV[s + 2], ARGV[s + 3], ARGV[s + 4], ARGV[s + 5]
  end
  if ov ~= '-' then okey = KEYS[k]; k = k + 1 end
  return k, i, state, entry, denials, now, cost, extra, need, code, ARGV[s], ARGV[s + 1],
    mode, after, within, dur, reason, okey, ov
end
