-- shardlimit main: charge, refund, reserve or settle, one call each (core/src/limiter/settle.rs).
-- Assembled per algorithm as prelude + its algorithm file + check.lua + settle.lua + this file.
-- KEYS[1..4]  state key, block-list entry, denial counter (the two: reserve only), the
--             key's override entry (read only when ARGV[14] is not "-")
-- ARGV[1]     op: "charge", "refund", "reserve" or "settle"
-- ARGV[2]     now (µs), or "0" for the server clock (TIME)
-- ARGV[3..5]  code, limit, period (µs) of the policy
-- ARGV[6]     units: charged, given back, reserved (reserve), or reserved before (settle)
-- ARGV[7]     settle: the actual units;  ARGV[8] settle: when the reservation was recorded
-- ARGV[9..12] reserve: after, within, dur, reason (automatic blocking, as a check's)
-- ARGV[13]    the algorithm's 7th argument, as a check's: a window's per-key shift, an
--             exact bucket interval's denominator, or ""
-- ARGV[14]    the override version the client decided with, as a check's (check.lua):
--             "-" (the policy takes none), "" (none) or the version it holds
-- Returns {allowed, remaining, reset_after_us, retry_after_us, delay_us, blocked, units
-- admitted, now}: reserve's are a check's; the others' always allow and describe the key
-- after the call (a peek of one unit: remaining is 0 in debt). Or {'o', entry, 0}, as a
-- check's, when the key's override is not the one the client sent: nothing was done.
local op = ARGV[1]
local now = clock(ARGV[2])
local code, limit, period = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local units = tonumber(ARGV[6])
local x = ARGV[13]
local ov = ARGV[14]
if ov ~= '-' then
  -- the key's limit in force is the override the client sent (its state key and limit are
  -- the call's), else nothing is done and the client calls again with the entry
  local changed = override_changed(KEYS[4], ov, 0) -- (override.lua)
  if changed then return changed end
end
if op == 'reserve' then
  local r = check(KEYS[1], KEYS[2], KEYS[3], int(now), ARGV[6], x, ARGV[6], code, ARGV[4],
    ARGV[5], 'check', ARGV[9], ARGV[10], ARGV[11], ARGV[12], nil, '-')
  -- (okey nil, ov '-': the override was read above)
  r[8] = now
  return r
end
if op == 'charge' then
  CHARGE[code](KEYS[1], now, limit, period, units, x)
elseif op == 'refund' then
  GIVE[code](KEYS[1], now, limit, period, units, now, 0, x)
elseif op == 'settle' then
  local actual = tonumber(ARGV[7])
  if actual < units then
    GIVE[code](KEYS[1], now, limit, period, units - actual, tonumber(ARGV[8]), units, x)
  elseif actual > units then
    CHARGE[code](KEYS[1], now, limit, period, actual - units, x)
  end
else
  return redis.error_reply('shardlimit: unknown settle op')
end
local _, remaining, reset = ALGO[code](KEYS[1], now, limit, period, 1, true, x)
return {1, remaining, reset, -1, 0, 0, 0, now}
