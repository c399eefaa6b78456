-- shardlimit: shared prelude of every script (scripts are assembled at compile time as
-- prelude + algorithm file(s) + one main; see core/src/engine/redis/scripts.rs).
--
-- Every algorithm is a function ALGO.<code>(key, now, limit, period, cost, peek, extra)
-- returning five values: allowed (0/1), remaining, reset_after_us, retry_after_us (-1 =
-- absent), delay_us (values, not a table: a table per check costs Redis more than the
-- check's reply; a caller that needs one makes it, `{fn(...)}`). `peek` true never consumes (concurrency reclaims expired leases, which
-- changes no decision). `period` is the window, the lease TTL, or the
-- emission interval (µs per unit) of a bucket. `extra` is what the algorithm needs beyond
-- those, "" when unused: the lease id of a concurrency limit, the per-key window shift
-- (fixed and sliding window, named `shift` there) or the exact interval's denominator
-- (buckets, named `q` there). `st` (the 8th argument, nil outside layered checks) is a
-- table for what the function read of the state: a call with an empty table fills it, a
-- later call with the filled table takes its reads from there instead of Redis (the
-- layered script's consuming pass after its peeking one: one read per layer, not two; only
-- valid when nothing wrote the state in between). `m` (the 9th argument, nil outside batch
-- calls) is a memo the batch script keeps per policy value set for one call (one `now`):
-- its slots from 3 on are the algorithm's, for values derived from now and the period alone
-- (fixed and sliding window keep their window index and TTL formatted there). Integers are
-- formatted with %d, never tostring, so that values up to 2^53 survive exactly.
local ALGO = {}
-- redis.call, as every script calls it: a local is read for less than a global's field
local rcall = redis.call
-- REFUND.<code>(key, now, period, cost, extra) gives back `cost` units admitted at `now`
-- (layered checks across shards, when another shard denied). Only the refund and release
-- scripts have the table (`local REFUND = {}` comes before this prelude); in a check or
-- layered script REFUND is nil and the algorithm files skip defining those functions: a
-- closure made on every call costs Redis about 2 us.

-- (a string in arithmetic is converted as tonumber would: half the instructions of the call)
local function clock(arg)
  if arg == '0' then
    local t = redis.call('TIME')
    return t[1] * 1000000 + t[2]
  end
  return tonumber(arg)
end

local function int(x)
  return string.format('%d', x)
end
