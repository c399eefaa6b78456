-- shardlimit main: N checks of one algorithm in one call (the pipelined connection of async
-- callers sends the checks of a burst together). Running them back to back in one script
-- is what N separate calls would do, one after another; the call's fixed cost (EVALSHA,
-- the script's setup, TIME) is paid once.
-- Assembled as prelude + one algorithm file + check.lua + this file.
-- KEYS[3i-2..3i] and ARGV[12(i-1)+1..12i]: check i's keys and arguments (see check.lua).
-- Returns an array of N replies: check i's result, or an error reply of its own (one
-- check's error, WRONGTYPE say, leaves the others' results standing).
local out = {}
for i = 1, #KEYS / 3 do
  local ok, r = pcall(check, KEYS, 3 * (i - 1), ARGV, 12 * (i - 1))
  if ok then
    out[i] = r
  elseif type(r) == 'table' and r.err then
    out[i] = r
  else
    out[i] = {err = tostring(r)}
  end
end
return out
