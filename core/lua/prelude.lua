-- shardlimit: shared prelude of every script (scripts are assembled at compile time as
-- prelude + algorithm file(s) + one main; see core/src/scripts.rs).
--
-- Every algorithm is a function ALGO.<code>(key, now, limit, period, cost, peek, lease)
-- returning {allowed (0/1), remaining, reset_after_us, retry_after_us (-1 = absent),
-- delay_us}. `peek` true never consumes (concurrency reclaims expired leases, which
-- changes no decision). `period` is the window, the lease TTL, or the
-- emission interval (µs per unit) of a bucket. `lease` is the lease id of a concurrency
-- limit, and for the others an extra argument, "" when unused: the per-key window shift
-- (fixed and sliding window) or the exact interval's denominator (buckets). Integers are
-- formatted with %d, never tostring, so that values up to 2^53 survive exactly.
local ALGO = {}
-- REFUND.<code>(key, now, period, cost, lease) gives back `cost` units admitted at `now`
-- (layered checks across shards, when another shard denied). Only the layered and refund
-- scripts have the table (`local REFUND = {}` comes before this prelude); in a check script
-- REFUND is nil and the algorithm files skip defining those functions: a closure made on
-- every call costs Redis about 2 us.

local function clock(arg)
  local now = tonumber(arg)
  if now == 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

local function int(x)
  return string.format('%d', x)
end
