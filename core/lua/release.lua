-- shardlimit main: release a concurrency lease. Assembled as prelude + concurrency.lua +
-- this file (with the REFUND table, where concurrency.lua defines the release).
-- KEYS[1]  the policy's state key for the key
-- ARGV[1]  the lease id;  ARGV[2] its units (the core has checked both)
-- ARGV[3]  now in µs, or "0" for the server clock (TIME)
-- ARGV[4]  the lease TTL in µs: a lease not found leaves a tombstone that long, so that
--          its acquire, if it runs later (it missed its deadline), grants nothing
-- Returns 1 when the lease was held at `now`, 0 when it was not (released before, or
-- expired, or not acquired yet).
return REFUND.cc(KEYS[1], clock(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[2]), ARGV[1])
