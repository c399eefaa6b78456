-- shardlimit: sliding window, two-counter estimate (Cloudflare):
--   estimate = previous * (window - elapsed) / window + current
-- KEYS[1]  base key; counters live in KEYS[1]..':'..window_index
-- ARGV[1]  now in microseconds, or "0" to read the server clock (TIME)
-- ARGV[2]  limit            ARGV[3] window (µs)
-- ARGV[4]  cost             ARGV[5] "1" = peek (never writes)
-- Returns {allowed, remaining, reset_after_us, retry_after_us (-1 = absent), delay_us}
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local limit = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local idx = math.floor(now / window)
local elapsed = now - idx * window
local ckey = KEYS[1] .. ':' .. string.format('%d', idx)
local cur = tonumber(redis.call('GET', ckey) or '0')
local prev = tonumber(redis.call('GET', KEYS[1] .. ':' .. string.format('%d', idx - 1)) or '0')

-- The estimate at offset e into a window whose counters are (p, c). The Rust
-- in-memory engine evaluates the very same expression, so both round alike.
local function fits(p, c, e)
  return p * (window - e) / window + c + cost <= limit
end
local function estimate_remaining(p, c, e, extra)
  local r = math.floor(limit - (p * (window - e) / window + c) - extra)
  if r < 0 then r = 0 end
  return r
end

-- time until both counters have aged out
local reset
if cur > 0 then reset = 2 * window - elapsed elseif prev > 0 then reset = window - elapsed else reset = 0 end

if cost > limit then
  return {0, estimate_remaining(prev, cur, elapsed, 0), reset, -1, 0}
end
if fits(prev, cur, elapsed) then
  if ARGV[5] ~= '1' then
    redis.call('INCRBY', ckey, cost)
    redis.call('PEXPIRE', ckey, math.ceil((2 * window - elapsed) / 1000))
    cur = cur + cost
    reset = 2 * window - elapsed
  end
  return {1, estimate_remaining(prev, cur, elapsed, 0), reset, -1, 0}
end
-- Denied: find the earliest offset where the same cost fits with no other traffic.
local retry
if cur + cost <= limit then
  -- still in this window, waiting for the previous window's weight to decay (prev > 0 here)
  local e = math.ceil(window - (limit - cur - cost) * window / prev)
  if e < elapsed then e = elapsed end
  if e > window then e = window end
  while e < window and not fits(prev, cur, e) do e = e + 1 end
  while e > elapsed + 1 and fits(prev, cur, e - 1) do e = e - 1 end
  retry = e - elapsed
  if e >= window then retry = window - elapsed end
else
  -- must wait for the next window, where this window's count becomes the previous one
  local e = 0
  if cur > 0 then e = math.ceil(window - (limit - cost) * window / cur) end
  if e < 0 then e = 0 end
  if e > window then e = window end
  while e < window and not fits(cur, 0, e) do e = e + 1 end
  while e > 0 and fits(cur, 0, e - 1) do e = e - 1 end
  retry = window - elapsed + e
end
return {0, estimate_remaining(prev, cur, elapsed, 0), reset, retry, 0}
