-- shardlimit main: one check in one round trip (blocking callers, Cluster, Sentinel, TLS),
-- enforcing or in shadow mode: the one source of both (the shadow script is this file
-- assembled with `local SHADOW = true` before the prelude, the check script with
-- `local SHADOW`, so the check's argument layout is written once).
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS[1..4]  state key, block-list entry, denial counter, override entry (see check.lua)
-- ARGV[1..5]  now, cost, extra, need, override version: the check's own arguments
-- ARGV[6..13] code, limit, period, mode, after, within, dur, reason: its policy's
-- ARGV[14]    the call's tag, echoed as the reply's last value: the client takes a reply
--             only if it carries the tag of the call it waits for
-- In shadow mode: a would-be denial is returned as a denial (the client allows it and
-- reports it as shadow-denied), consumes nothing, never counts toward automatic blocking
-- (ARGV[10], block-after, is taken as 0), and is counted by key in the policy's shadow
-- hash on this shard. A block-list denial is not a shadow denial and is not counted; an
-- override reply ({'o', ...}) decided nothing and counts nothing.
-- KEYS[5]     the policy's shadow hash on this shard (absent: count nothing, in a Cluster)
-- ARGV[15]    the user key (the hash field)
-- ARGV[16]    the hash's TTL in ms, renewed by every count
-- ARGV[17]    the most keys the hash holds; the denials of further keys count in field ""
--             (no user key is empty)
local r = check(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7],
  ARGV[8], ARGV[9], SHADOW and '0' or ARGV[10], ARGV[11], ARGV[12], ARGV[13], KEYS[4], ARGV[5])
if SHADOW and r[1] == 0 and r[6] == 0 and KEYS[5] then
  local h, field = KEYS[5], ARGV[15]
  if redis.call('HEXISTS', h, field) == 0 and redis.call('HLEN', h) >= tonumber(ARGV[17]) then
    field = ''
  end
  redis.call('HINCRBY', h, field, 1)
  redis.call('PEXPIRE', h, ARGV[16])
end
r[#r + 1] = tonumber(ARGV[14])
return r
