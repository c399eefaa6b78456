-- shardlimit main: N checks of one algorithm in one call (the pipelined connection of async
-- callers sends the checks of a burst together). Running them back to back in one script
-- is what N separate calls would do, one after another; the call's fixed cost (EVALSHA,
-- the script's setup, TIME) is paid once, and the policy values the checks share are
-- sent once.
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS            every check's keys, one check after another (check.lua's layout)
-- ARGV[1]         S, the number of distinct policy value sets ("shapes")
-- then S shapes   each as its number of values, then the values (check.lua's layout:
--                 limit, period, and auto-block's four when the checks of it say `a`)
-- then per check  its shape (1..S), its own values (cost, and its flags and their values
--                 if any), its tag (echoed as the last value of its reply, see
--                 main_check.lua)
-- Returns an array of N replies: check i's result, or an error reply of its own (one
-- check's error, WRONGTYPE say, leaves the others' results standing).
local S = tonumber(ARGV[1])
local shape = {}
local a = 2
for j = 1, S do
  shape[j] = a + 1
  a = a + 1 + tonumber(ARGV[a])
end
local code = next(ALGO)
local fn = ALGO[code]
-- a shape's limit and period as numbers, parsed once per call (plain checks)
local numbers = {}
local out = {}
local k, n = 1, #ARGV
local state, entry, denials, now, cost, extra, need, c, limit, period, mode, after, within,
  dur, reason, okey, ov
while a <= n do
  local tag = ARGV[a + 2]
  if string.byte(tag) <= 57 then
    -- a plain check (no flags: its shape, cost, tag), as check_plain.lua answers one: the
    -- block entry, the algorithm in mode check on the server clock, its reply built once
    -- (an admission of all units with no retry and no delay in short), the tag echoed as
    -- the string it came as
    local j = tonumber(ARGV[a])
    local ln = numbers[j]
    if ln == nil then
      ln = {tonumber(ARGV[shape[j]]), tonumber(ARGV[shape[j] + 1])}
      numbers[j] = ln
    end
    local ttl = redis.call('PTTL', KEYS[k + 1])
    if ttl == -1 then
      out[#out + 1] = {0, 0, 0, -1, 0, 1, 0, tag}
    elseif ttl ~= -2 then
      out[#out + 1] = {0, 0, ttl * 1000, ttl * 1000, 0, 1, 0, tag}
    else
      if server_now == nil then server_now = clock('0') end
      cost = ARGV[a + 1]
      if cost == '1' then cost = 1 else cost = tonumber(cost) end
      local ok, r = pcall(fn, KEYS[k], server_now, ln[1], ln[2], cost, false, '')
      if not ok then
        if type(r) == 'table' and r.err then out[#out + 1] = r else out[#out + 1] = {err = tostring(r)} end
      elseif r[1] == 1 then
        if r[4] == -1 and r[5] == 0 then
          out[#out + 1] = {r[2], r[3], tag}
        else
          out[#out + 1] = {1, r[2], r[3], r[4], r[5], 0, cost, tag}
        end
      else
        out[#out + 1] = {0, r[2], r[3], r[4], r[5], 0, 0, tag}
      end
    end
    k = k + 2
    a = a + 3
  else
    local i
    k, i, state, entry, denials, now, cost, extra, need, c, limit, period, mode, after, within,
      dur, reason, okey, ov = parse(k, a + 1, shape[tonumber(ARGV[a])], code)
    local ok, r = pcall(check, state, entry, denials, now, cost, extra, need, c, limit, period,
      mode, after, within, dur, reason, okey, ov)
    if ok then
      r[#r + 1] = tonumber(ARGV[i])
      out[#out + 1] = r
    elseif type(r) == 'table' and r.err then
      out[#out + 1] = r
    else
      out[#out + 1] = {err = tostring(r)}
    end
    a = i + 1
  end
end
return out
