-- shardlimit main: forget a key's state for one policy. Assembled as prelude + this file.
-- KEYS[1]  base key
-- ARGV[1]  now in µs, or "0" for the server clock (TIME)
-- ARGV[2]  window (µs) for the windowed counters, whose state lives in
--          KEYS[1]..':'..index for the current and previous window; "0" otherwise
-- ARGV[3]  the key's window shift (µs; "0" unless per-key window offsets), added to now
-- Returns the number of keys deleted.
local now = clock(ARGV[1]) + tonumber(ARGV[3] or '0')
local window = tonumber(ARGV[2])
if window == 0 then
  return rcall('DEL', KEYS[1])
end
local idx = math.floor(now / window)
return rcall('DEL', KEYS[1] .. ':' .. int(idx), KEYS[1] .. ':' .. int(idx - 1))
