-- shardlimit main: one check, with the block list and automatic blocking, in one round trip.
-- Assembled as prelude + one algorithm file + this file.
-- KEYS[1]  the algorithm's state key
-- KEYS[2]  the key's block-list entry (any value; PTTL -1 = permanent)
-- KEYS[3]  the policy's denial counter for this key (automatic blocking)
-- ARGV[1]  now in µs, or "0" for the server clock (TIME)
-- ARGV[2]  algorithm code (fw, sw, sl, tb, lb, cc)
-- ARGV[3]  limit     ARGV[4] period (µs)     ARGV[5] cost
-- ARGV[6]  mode: "check"; "peek" (never writes); "grant" (admit min(cost, available) units,
--          at least one: local admission reserves a batch this way)
-- ARGV[7]  lease id (concurrency)
-- ARGV[8]  block after this many denials (0 = never)   ARGV[9] ... counted within (ms)
-- ARGV[10] ... for this long (ms)                      ARGV[11] reason stored in the block entry
-- ARGV[12] grant mode: the fewest units worth admitting (the request's own cost)
-- Returns {allowed, remaining, reset_after_us, retry_after_us (-1 = absent), delay_us,
--          blocked (0 no, 1 blocked, 2 blocked by this very denial), units admitted}
local now = clock(ARGV[1])
local ttl = redis.call('PTTL', KEYS[2])
if ttl ~= -2 then
  if ttl == -1 then return {0, 0, 0, -1, 0, 1, 0} end
  return {0, 0, ttl * 1000, ttl * 1000, 0, 1, 0}
end
local fn = ALGO[ARGV[2]]
local limit, period, cost, mode = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local r
if mode == 'grant' then
  local need = tonumber(ARGV[12])
  r = fn(KEYS[1], now, limit, period, need, true, ARGV[7])
  if r[1] == 1 then
    -- r[2] is what is available now; take up to `cost` of it, at least `need`
    local g = math.max(need, math.min(cost, r[2]))
    r = fn(KEYS[1], now, limit, period, g, false, ARGV[7])
    if r[1] == 1 then r[7] = g end
  end
else
  r = fn(KEYS[1], now, limit, period, cost, mode == 'peek', ARGV[7])
  if r[1] == 1 and mode ~= 'peek' then r[7] = cost end
end
r[6] = 0
if r[7] == nil then r[7] = 0 end
local after = tonumber(ARGV[8])
if r[1] == 0 and mode ~= 'peek' and after > 0 then
  local n = redis.call('INCR', KEYS[3])
  if n == 1 then redis.call('PEXPIRE', KEYS[3], ARGV[9]) end
  if n >= after then
    redis.call('SET', KEYS[2], ARGV[11], 'PX', ARGV[10])
    redis.call('DEL', KEYS[3])
    r[6] = 2
  end
end
return r
