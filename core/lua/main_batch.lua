-- shardlimit main: N checks of one algorithm in one call (the pipelined connection of async
-- callers sends the checks of a burst together). Running them back to back in one script
-- is what N separate calls would do, one after another; the call's fixed cost (EVALSHA,
-- the script's setup, TIME) is paid once, and the policy arguments the checks share are
-- sent once.
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS[4i-3..4i]  check i's state key, block-list entry, denial counter, override entry
--                 (see check.lua)
-- ARGV[1]         S, the number of distinct policy argument sets ("shapes")
-- ARGV[2..1+8S]   the shapes: code, limit, period, mode, after, within, dur, reason each
-- then 7 per check: now, cost, extra (check.lua), need, override version, its shape
-- (1..S), its tag (echoed as the last value of its reply, see main_check.lua)
-- Returns an array of N replies: check i's result, or an error reply of its own (one
-- check's error, WRONGTYPE say, leaves the others' results standing).
local S = tonumber(ARGV[1])
local items = 2 + 8 * S
local out = {}
for i = 1, #KEYS / 4 do
  local a = items + 7 * (i - 1)
  local s = 2 + 8 * (tonumber(ARGV[a + 5]) - 1)
  local ok, r = pcall(check, KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], ARGV[a], ARGV[a + 1],
    ARGV[a + 2], ARGV[a + 3], ARGV[s], ARGV[s + 1], ARGV[s + 2], ARGV[s + 3], ARGV[s + 4],
    ARGV[s + 5], ARGV[s + 6], ARGV[s + 7], KEYS[4 * i], ARGV[a + 4])
  if ok then
    r[#r + 1] = tonumber(ARGV[a + 6])
    out[i] = r
  elseif type(r) == 'table' and r.err then
    out[i] = r
  else
    out[i] = {err = tostring(r)}
  end
end
return out
