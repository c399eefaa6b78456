-- shardlimit main: one check in one round trip (blocking callers, Cluster, Sentinel, TLS),
-- enforcing or in shadow mode: the one source of both (the shadow script is this file
-- assembled with `local SHADOW = true` before the prelude, the check script with
-- `local SHADOW`, so the check's argument layout is written once).
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS, ARGV  the check's keys, its own values and its policy's (check.lua's layout: a
--             plain check is KEYS {state, block entry}, ARGV {cost, limit, period, tag})
-- ARGV[n]     (after them) the call's tag, echoed as the reply's last value: the client
--             takes a reply only if it carries the tag of the call it waits for
-- In shadow mode: a would-be denial is returned as a denial (the client allows it and
-- reports it as shadow-denied), consumes nothing, never counts toward automatic blocking
-- (after is taken as "0"), and is counted by key in the policy's shadow hash on this
-- shard. A block-list denial is not a shadow denial and is not counted; an override
-- reply ({'o', ...}) decided nothing and counts nothing. The shadow build's call has,
-- after the check's:
-- KEYS[k]     the policy's shadow hash on this shard (absent: count nothing, in a Cluster)
-- ARGV[n+1]   the user key (the hash field)
-- ARGV[n+2]   the hash's TTL in ms, renewed by every count
-- ARGV[n+3]   the most keys the hash holds; the denials of further keys count in field ""
--             (no user key is empty)
local n = #ARGV
local k, _, state, entry, denials, now, cost, extra, need, code, limit, period, mode, after,
  within, dur, reason, okey, ov = parse(1, 1, nil, next(ALGO))
if SHADOW then
  n = n - 3
  after = '0'
end
local r = check(state, entry, denials, now, cost, extra, need, code, limit, period, mode,
  after, within, dur, reason, okey, ov)
if SHADOW and r[1] == 0 and r[6] == 0 and KEYS[k] then
  local h, field = KEYS[k], ARGV[n + 1]
  if rcall('HEXISTS', h, field) == 0 and rcall('HLEN', h) >= tonumber(ARGV[n + 3]) then
    field = ''
  end
  rcall('HINCRBY', h, field, 1)
  rcall('PEXPIRE', h, ARGV[n + 2])
end
r[#r + 1] = tonumber(ARGV[n])
return r
