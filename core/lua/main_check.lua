-- shardlimit main: one check in one round trip (blocking callers, Cluster, Sentinel, TLS).
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS[1..4]  state key, block-list entry, denial counter, override entry (see check.lua)
-- ARGV[1..5]  now, cost, lease, need, override version: the check's own arguments
-- ARGV[6..13] code, limit, period, mode, after, within, dur, reason: its policy's
-- ARGV[14]    the call's tag, echoed as the reply's last value: the client takes a reply
--             only if it carries the tag of the call it waits for
local r = check(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7],
  ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13], KEYS[4], ARGV[5])
r[#r + 1] = tonumber(ARGV[14])
return r
