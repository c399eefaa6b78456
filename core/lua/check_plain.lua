-- shardlimit: the plain check of main_check.lua, before the rest of the check's code is
-- even defined (a function defined is a closure made on every call): KEYS {state, block
-- entry}, ARGV {cost, limit, period, tag} (check.lua's layout without flags), or with the
-- flags "x" alone ARGV {cost, "x", extra, limit, period, tag} (a concurrency lease, a
-- window's shift). What check() does for it, in short (mode check, the server clock, no
-- override, no automatic blocking), its reply built once: an admission of all its units
-- with no retry and no delay (the common answer) as {remaining, reset_after, tag}, the tag
-- echoed as the string it came as. Assembled after the algorithm
-- file in the single-check scripts only (the shadow build skips it: SHADOW is set).
-- (Told by its number of arguments, read once: a check with other flags has at least 5,
-- its flags among them, and "x" alone makes 6.)
local n = #ARGV
if not SHADOW and (n == 4 or (n == 6 and ARGV[2] == 'x')) then
  local s, extra = 2, ''
  if n == 6 then s, extra = 4, ARGV[3] end
  local tag = ARGV[n] -- echoed as the string it came as (batch.rs, untag)
  local ttl = rcall('PTTL', KEYS[2])
  if ttl ~= -2 then
    if ttl == -1 then return {0, 0, 0, -1, 0, 1, 0, tag} end
    return {0, 0, ttl * 1000, ttl * 1000, 0, 1, 0, tag}
  end
  local cost = ARGV[1]
  if cost == '1' then cost = 1 else cost = tonumber(cost) end
  -- (`+ 0`: the numbers as tonumber reads them, for half its instructions)
  local _, fn = next(ALGO)
  local allowed, remaining, reset, retry, delay = fn(KEYS[1], clock('0'), ARGV[s] + 0,
    ARGV[s + 1] + 0, cost, false, extra)
  if allowed == 1 then
    -- an admission of all `cost` units with no retry and no delay, in short:
    -- {remaining, reset_after} (protocol.rs, check_script_reply)
    if retry == -1 and delay == 0 then return {remaining, reset, tag} end
    return {1, remaining, reset, retry, delay, 0, cost, tag}
  end
  return {0, remaining, reset, retry, delay, 0, 0, tag}
end
