-- shardlimit main: a layered check of N (key, policy, cost) layers on one shard, atomic:
-- allowed only if every layer allows; if any layer denies, no layer consumes.
-- Assembled as prelude + every algorithm file + this file.
-- KEYS[3i-2], KEYS[3i-1], KEYS[3i]: layer i's state key, block entry and denial counter
-- ARGV[1]  now in µs, or "0" for the server clock (TIME)
-- ARGV[2]  N; then 9 arguments per layer, starting at ARGV[3 + 9(i-1)]:
--          code, limit, period, cost, extra (prelude.lua), block-after, within (ms), for
--          (ms), reason
-- Optional tail, for the one check of a multi-limit policy (all layers are one key's):
-- ARGV[3+9N]  the override version the client decided with, as check.lua's `ov`: "-" (read
--             none), "" (none) or the version it holds; KEYS[3N+1] the key's override entry
-- KEYS[3N+2]  shadow mode: the policy's shadow hash on this shard (absent: count nothing);
--             ARGV[4+9N..6+9N] the user key (field), the hash's TTL in ms, its most keys
--             (further keys count in field ""), as main_check.lua in shadow mode
-- ARGV[7+9N]  M, optional (absent: 0), for a layered check of layers whose policies take
--             overrides: M more override entries to compare, KEYS[#KEYS-M+j] the j-th, with
--             ARGV[7+9N+j] the version the client decided with ("" for none)
-- Returns {now, deciding layer (0 = all allowed), blocked (0/1/2), then per layer
--          allowed, remaining, reset_after_us, retry_after_us, delay_us}, or {'o', entry, j}
--          when override entry j (0: the tail's, else the j-th of the M) is not the one the
--          client sent (nothing decided)
local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local tail = 3 + 9 * n
local ov = ARGV[tail]
if ov and ov ~= '-' then
  local changed = override_changed(KEYS[3 * n + 1], ov, 0) -- (override.lua)
  if changed then return changed end
end
local m = tonumber(ARGV[tail + 4]) or 0
for j = 1, m do
  local changed = override_changed(KEYS[#KEYS - m + j], ARGV[tail + 4 + j], j)
  if changed then return changed end
end
local function arg(i, j) return ARGV[2 + 9 * (i - 1) + j] end
local out = {now, 0, 0}
for i = 1, n do
  local ttl = rcall('PTTL', KEYS[3 * i - 1])
  if ttl ~= -2 then
    out[2] = i
    out[3] = 1
    local retry = -1
    if ttl ~= -1 then retry = ttl * 1000 end
    for j = 1, n do
      local b = 5 * (j - 1) + 4
      out[b], out[b + 1], out[b + 2], out[b + 3], out[b + 4] = 0, 0, 0, -1, 0
    end
    local b = 5 * (i - 1) + 4
    out[b + 2], out[b + 3] = math.max(retry, 0), retry
    return out
  end
end
-- phase 1: would every layer allow? (no writes). Each layer's algorithm keeps what it read
-- in `st[i]`, and phase 2 consumes from that instead of reading the state again: the
-- script is atomic, so nothing changed in between, unless an earlier layer of phase 2
-- wrote the same state key (two layers of one key and scope): such a layer reads again.
-- (each layer's numbers are converted once, in `v`: a tonumber costs Redis about as much
-- as a GET)
local results, st, seen, v = {}, {}, {}, {}
for i = 1, n do
  local key = KEYS[3 * i - 2]
  local s = {}
  if seen[key] then s = nil else seen[key] = true end
  st[i] = s
  local b = 2 + 9 * (i - 1)
  local cost = ARGV[b + 4]
  if cost == '1' then cost = 1 else cost = tonumber(cost) end
  local limit, period = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  v[3 * i - 2], v[3 * i - 1], v[3 * i] = limit, period, cost
  local r = {ALGO[ARGV[b + 1]](key, now, limit, period, cost, true, ARGV[b + 5], s)}
  results[i] = r
  if r[1] == 0 and out[2] == 0 then out[2] = i end
end
if out[2] ~= 0 then
  local i = out[2]
  local after = tonumber(arg(i, 6))
  if after > 0 then
    local c = rcall('INCR', KEYS[3 * i])
    if c == 1 then rcall('PEXPIRE', KEYS[3 * i], arg(i, 7)) end
    if c >= after then
      rcall('SET', KEYS[3 * i - 1], arg(i, 9), 'PX', arg(i, 8))
      rcall('DEL', KEYS[3 * i])
      out[3] = 2
    end
  end
else
  -- phase 2: every layer allows, so every layer consumes
  for i = 1, n do
    results[i] = {ALGO[arg(i, 1)](KEYS[3 * i - 2], now, v[3 * i - 2], v[3 * i - 1], v[3 * i], false, arg(i, 5), st[i])}
  end
end
for i = 1, n do
  local r, b = results[i], 5 * i - 1
  out[b], out[b + 1], out[b + 2], out[b + 3], out[b + 4] = r[1], r[2], r[3], r[4], r[5]
end
local h = nil
if #KEYS - m >= 3 * n + 2 then h = KEYS[3 * n + 2] end
if h and out[2] ~= 0 and out[3] == 0 then
  -- a shadow check's would-be denial (its layers block nobody: their block-after is 0)
  local field = ARGV[tail + 1]
  if rcall('HEXISTS', h, field) == 0 and rcall('HLEN', h) >= tonumber(ARGV[tail + 3]) then
    field = ''
  end
  rcall('HINCRBY', h, field, 1)
  rcall('PEXPIRE', h, ARGV[tail + 2])
end
return out
