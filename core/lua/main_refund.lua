-- shardlimit main: give back units a layered check admitted on this shard when a layer on
-- another shard denied. Assembled as prelude + every algorithm file + this file.
-- KEYS[i]  layer i's state key
-- ARGV[1]  the `now` (µs) the admission used;  ARGV[2] N; then per layer, from ARGV[3 + 4(i-1)]:
--          code, period, cost, extra (prelude.lua)
local now = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
for i = 1, n do
  local b = 2 + 4 * (i - 1)
  REFUND[ARGV[b + 1]](KEYS[i], now, tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 4])
end
return n
