-- shardlimit main: charge, refund or settle every limit of a multi-limit policy on one key,
-- in one call (core/src/limiter/settle.rs). Assembled as prelude + every algorithm file +
-- settle.lua + this file. Each limit's op is as main_settle.lua's for that limit alone.
-- KEYS[i]  limit i's state key
-- ARGV[1]  op: "charge", "refund" or "settle"
-- ARGV[2]  now (µs), or "0" for the server clock (TIME)
-- ARGV[3]  N;  ARGV[4] settle: when the reservation was recorded (µs)
-- then per limit, from ARGV[5 + 6(i-1)]: code, limit, period, the algorithm's 7th argument
--          (see main_settle.lua), units (charged, given back, or reserved), actual (settle)
-- Optional tail, for a policy with overrides (as main_layered.lua's): ARGV[5+6N] the
-- override version the client acted with, as check.lua's `ov`: "-" (read none), "" (none)
-- or the version it holds; KEYS[N+1] the key's override entry
-- Returns {now, then per limit allowed (1), remaining, reset_after_us, -1, 0}: each limit
-- after the call (a peek of one unit); or {'o', entry, 0} when the key's override is not
-- the one the client sent (nothing done)
local op = ARGV[1]
local now = clock(ARGV[2])
local n = tonumber(ARGV[3])
local at = tonumber(ARGV[4])
if op ~= 'charge' and op ~= 'refund' and op ~= 'settle' then
  return redis.error_reply('shardlimit: unknown settle op')
end
local ov = ARGV[5 + 6 * n]
if ov and ov ~= '-' then
  local changed = override_changed(KEYS[n + 1], ov, 0) -- (override.lua)
  if changed then return changed end
end
local out = {now}
for i = 1, n do
  local b = 4 + 6 * (i - 1)
  local code, limit, period, x = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 4]
  local units, actual = tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
  if CHARGE[code] == nil then return redis.error_reply('shardlimit: unknown algorithm code') end
  if op == 'charge' then
    CHARGE[code](KEYS[i], now, limit, period, units, x)
  elseif op == 'refund' then
    GIVE[code](KEYS[i], now, limit, period, units, now, 0, x)
  elseif actual < units then
    GIVE[code](KEYS[i], now, limit, period, units - actual, at, units, x)
  elseif actual > units then
    CHARGE[code](KEYS[i], now, limit, period, actual - units, x)
  end
  local _, remaining, reset = ALGO[code](KEYS[i], now, limit, period, 1, true, x)
  out[#out + 1] = 1
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = -1
  out[#out + 1] = 0
end
return out
