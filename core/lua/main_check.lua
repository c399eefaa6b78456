-- shardlimit main: one check in one round trip (blocking callers, Cluster, Sentinel, TLS).
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS[1..3]  state key, block-list entry, denial counter (see check.lua)
-- ARGV[1..4]  now, cost, lease, need: the check's own arguments
-- ARGV[5..12] code, limit, period, mode, after, within, dur, reason: its policy's
-- ARGV[13]    the call's tag, echoed as the reply's 8th value: the client takes a reply
--             only if it carries the tag of the call it waits for
local r = check(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6],
  ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12])
r[8] = tonumber(ARGV[13])
return r
