-- shardlimit main: read one key's state for one policy, to carry it to another shard after
-- a reshard. Assembled as prelude + this file.
-- KEYS[1]  the state's base key     KEYS[2] the key's block-list entry
-- ARGV[1]  now in µs, or "0" for the server clock (TIME)
-- ARGV[2]  window (µs) of windowed counters (state in KEYS[1]..':'..index); "0" otherwise
-- ARGV[3]  the key's window shift (µs; "0" unless per-key window offsets), added to now
-- Returns {name, pttl (0 = none), DUMP payload, ...} for each of those keys that exists.
local now = clock(ARGV[1]) + tonumber(ARGV[3] or '0')
local window = tonumber(ARGV[2])
local names
if window == 0 then
  names = {KEYS[1], KEYS[2]}
else
  local idx = math.floor(now / window)
  names = {KEYS[1] .. ':' .. int(idx), KEYS[1] .. ':' .. int(idx - 1), KEYS[2]}
end
local out = {}
for _, name in ipairs(names) do
  local payload = rcall('DUMP', name)
  if payload then
    local ttl = rcall('PTTL', name)
    if ttl < 0 then ttl = 0 end
    out[#out + 1] = name
    out[#out + 1] = ttl
    out[#out + 1] = payload
  end
end
return out
