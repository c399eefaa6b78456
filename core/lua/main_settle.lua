-- shardlimit main: charge, refund, reserve or settle, one call each (core/src/limiter/settle.rs).
-- Assembled per algorithm as prelude + its algorithm file + check.lua + settle.lua + this file.
-- KEYS[1..3]  state key, block-list entry, denial counter (the last two: reserve only)
-- ARGV[1]     op: "charge", "refund", "reserve" or "settle"
-- ARGV[2]     now (µs), or "0" for the server clock (TIME)
-- ARGV[3..5]  code, limit, period (µs) of the policy
-- ARGV[6]     units: charged, given back, reserved (reserve), or reserved before (settle)
-- ARGV[7]     settle: the actual units;  ARGV[8] settle: when the reservation was recorded
-- ARGV[9..12] reserve: after, within, dur, reason (automatic blocking, as a check's)
-- Returns {allowed, remaining, reset_after_us, retry_after_us, delay_us, blocked, units
-- admitted, now}: reserve's are a check's; the others' always allow and describe the key
-- after the call (a peek of one unit: remaining is 0 in debt).
local op = ARGV[1]
local now = clock(ARGV[2])
local code, limit, period = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local units = tonumber(ARGV[6])
if op == 'reserve' then
  local r = check(KEYS[1], KEYS[2], KEYS[3], int(now), ARGV[6], '', ARGV[6], code, ARGV[4],
    ARGV[5], 'check', ARGV[9], ARGV[10], ARGV[11], ARGV[12], nil, '-')
  -- (okey nil, ov '-': settle refuses policies that take overrides, so none is read)
  r[8] = now
  return r
end
if op == 'charge' then
  CHARGE[code](KEYS[1], now, limit, period, units)
elseif op == 'refund' then
  GIVE[code](KEYS[1], now, limit, period, units, now, 0)
elseif op == 'settle' then
  local actual = tonumber(ARGV[7])
  if actual < units then
    GIVE[code](KEYS[1], now, limit, period, units - actual, tonumber(ARGV[8]), units)
  elseif actual > units then
    CHARGE[code](KEYS[1], now, limit, period, actual - units)
  end
else
  return redis.error_reply('shardlimit: unknown settle op')
end
local p = ALGO[code](KEYS[1], now, limit, period, 1, true, '')
return {1, p[2], p[3], -1, 0, 0, 0, now}
