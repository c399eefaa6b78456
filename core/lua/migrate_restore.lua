-- shardlimit main: write state read by migrate_dump.lua on the key's new shard, unless the
-- new shard already has state of its own for that key (it is newer). Prelude + this file.
-- KEYS[i]  names;  ARGV[2i-1], ARGV[2i]: the key's pttl (0 = none) and DUMP payload
-- Returns the number of keys restored.
local n = 0
for i, name in ipairs(KEYS) do
  if rcall('EXISTS', name) == 0 then
    local ok = redis.pcall('RESTORE', name, ARGV[2 * i - 1], ARGV[2 * i])
    if type(ok) ~= 'table' or not ok.err then n = n + 1 end
  end
end
return n
