-- shardlimit main: one check in shadow mode, in one round trip. A would-be denial is
-- returned as a denial (the client allows it and reports it as shadow-denied), consumes
-- nothing, never counts toward automatic blocking, and is counted by key in the policy's
-- shadow hash on this shard. A block-list denial is not a shadow denial and is not counted.
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS[1..4]  state key, block-list entry, denial counter, override entry (see check.lua)
-- KEYS[5]     the policy's shadow hash on this shard (absent: count nothing, in a Cluster)
-- ARGV[1..14] as main_check.lua (ARGV[10], block-after, is ignored: shadow never blocks)
-- ARGV[15]    the user key (the hash field)
-- ARGV[16]    the hash's TTL in ms, renewed by every count
-- ARGV[17]    the most keys the hash holds; the denials of further keys count in field ""
--             (no user key is empty)
local r = check(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7],
  ARGV[8], ARGV[9], '0', ARGV[11], ARGV[12], ARGV[13], KEYS[4], ARGV[5])
if r[1] == 0 and r[6] == 0 and KEYS[5] then
  local h, field = KEYS[5], ARGV[15]
  if redis.call('HEXISTS', h, field) == 0 and redis.call('HLEN', h) >= tonumber(ARGV[17]) then
    field = ''
  end
  redis.call('HINCRBY', h, field, 1)
  redis.call('PEXPIRE', h, ARGV[16])
end
r[#r + 1] = tonumber(ARGV[14])
return r
