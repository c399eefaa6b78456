-- shardlimit: one check, with the block list and automatic blocking. Shared by main_check
-- (one check per call) and main_batch (many checks of one algorithm per call).
-- check(K, k, A, a) reads its keys from K[k+1..k+3] and its arguments from A[a+1..a+12]:
-- K[k+1]  the algorithm's state key
-- K[k+2]  the key's block-list entry (any value; PTTL -1 = permanent)
-- K[k+3]  the policy's denial counter for this key (automatic blocking)
-- A[a+1]  now in µs, or "0" for the server clock (TIME, read once per script call)
-- A[a+2]  algorithm code (fw, sw, sl, tb, lb, cc)
-- A[a+3]  limit     A[a+4] period (µs)     A[a+5] cost
-- A[a+6]  mode: "check"; "peek" (never writes); "grant" (admit min(cost, available) units,
--         at least one: local admission reserves a batch this way)
-- A[a+7]  lease id (concurrency)
-- A[a+8]  block after this many denials (0 = never)   A[a+9] ... counted within (ms)
-- A[a+10] ... for this long (ms)                      A[a+11] reason stored in the block entry
-- A[a+12] grant mode: the fewest units worth admitting (the request's own cost)
-- Returns {allowed, remaining, reset_after_us, retry_after_us (-1 = absent), delay_us,
--          blocked (0 no, 1 blocked, 2 blocked by this very denial), units admitted}
local server_now
local function check(K, k, A, a)
  local now = tonumber(A[a + 1])
  if now == 0 then
    if server_now == nil then server_now = clock('0') end
    now = server_now
  end
  local ttl = redis.call('PTTL', K[k + 2])
  if ttl ~= -2 then
    if ttl == -1 then return {0, 0, 0, -1, 0, 1, 0} end
    return {0, 0, ttl * 1000, ttl * 1000, 0, 1, 0}
  end
  local fn = ALGO[A[a + 2]]
  local key = K[k + 1]
  local limit, period, cost, mode = tonumber(A[a + 3]), tonumber(A[a + 4]), tonumber(A[a + 5]), A[a + 6]
  local r
  if mode == 'grant' then
    local need = tonumber(A[a + 12])
    r = fn(key, now, limit, period, need, true, A[a + 7])
    if r[1] == 1 then
      -- r[2] is what is available now; take up to `cost` of it, at least `need`
      local g = math.max(need, math.min(cost, r[2]))
      r = fn(key, now, limit, period, g, false, A[a + 7])
      if r[1] == 1 then r[7] = g end
    end
  else
    r = fn(key, now, limit, period, cost, mode == 'peek', A[a + 7])
    if r[1] == 1 and mode ~= 'peek' then r[7] = cost end
  end
  r[6] = 0
  if r[7] == nil then r[7] = 0 end
  local after = tonumber(A[a + 8])
  if r[1] == 0 and mode ~= 'peek' and after > 0 then
    local n = redis.call('INCR', K[k + 3])
    if n == 1 then redis.call('PEXPIRE', K[k + 3], A[a + 9]) end
    if n >= after then
      redis.call('SET', K[k + 2], A[a + 11], 'PX', A[a + 10])
      redis.call('DEL', K[k + 3])
      r[6] = 2
    end
  end
  return r
end
