-- shardlimit main: one check in one round trip (blocking callers, Cluster, Sentinel, TLS).
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS and ARGV are check()'s three keys and twelve arguments (see check.lua).
return check(KEYS, 0, ARGV, 0)
