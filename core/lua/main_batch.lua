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
-- or, the compact layout (every check plain, of one shape, cost 1: the common burst):
-- ARGV[1]         "0", ARGV[2] the shape's number of values (2), then its values (limit,
--                 period), then the call's tag (KEYS: every check's state, then every
--                 check's block entry, in the checks' order);
--                 the replies as below after the call's tag, each with its check's place
--                 in the call (1..N) where its tag would be
-- Returns the N replies in order, each an array (check i's result, its tag last) or an
-- error reply of its own (one check's error, WRONGTYPE say, leaves the others' results
-- standing); but the short reply of a plain check's admission (check_plain.lua's
-- {remaining, reset_after, tag}) inline, its three values in place of one (a table per
-- check costs Redis more than its three values): an integer where a reply starts is one
-- (transport/batch.rs, split_batch).
local code = next(ALGO)
local fn = ALGO[code]
local out = {}
local m = 0 -- values in out
if ARGV[1] == '0' then
  -- The compact layout (transport/batch.rs, pack_calls): every check plain, of one shape,
  -- cost 1, no flags. ARGV {"0", L, the shape's L values (limit, period), the call's tag};
  -- KEYS every check's state, then every check's block entry (read by one EXISTS of
  -- KEYS[n + 1..2n], no table built). Answered as the plain checks below are, after the
  -- call's tag, each reply with its check's place in the call (1..n) where its tag goes.
  local n = #KEYS / 2
  out[1] = ARGV[3 + ARGV[2]]
  m = 1
  -- (the memo sized once, not grown: prelude.lua)
  local ln = {ARGV[3] + 0, ARGV[4] + 0, false, false, false, false, false, false, false}
  local blocks = true
  if n >= 3 then
    blocks = rcall('EXISTS', unpack(KEYS, n + 1, 2 * n)) > 0
  end
  -- the checks run in one protected call, not one each (a pcall per check costs more than
  -- its GET): a check's error (WRONGTYPE, say) is its reply, and the run goes on from the
  -- check after it (a check's reply is written only once its algorithm has returned)
  local i, now = 0, nil
  local KEYS, ARGV = KEYS, ARGV -- (a local is read for less than a global)
  local function run()
    while i < n do
      i = i + 1
      local tag = i
      local ttl = -2
      if blocks then ttl = rcall('PTTL', KEYS[n + i]) end
      if ttl == -1 then
        m = m + 1
        out[m] = {0, 0, 0, -1, 0, 1, 0, tag}
      elseif ttl ~= -2 then
        m = m + 1
        out[m] = {0, 0, ttl * 1000, ttl * 1000, 0, 1, 0, tag}
      else
        if now == nil then now = clock('0') end
        local r, remaining, reset, retry, delay = fn(KEYS[i], now, ln[1], ln[2], 1, false,
          '', nil, ln)
        if r == 1 then
          if retry == -1 and delay == 0 then
            out[m + 1], out[m + 2], out[m + 3] = remaining, reset, tag
            m = m + 3
          else
            m = m + 1
            out[m] = {1, remaining, reset, retry, delay, 0, 1, tag}
          end
        else
          m = m + 1
          out[m] = {0, remaining, reset, retry, delay, 0, 0, tag}
        end
      end
    end
  end
  while true do
    local ok, e = pcall(run)
    if ok then break end
    m = m + 1
    if type(e) == 'table' and e.err then out[m] = e else out[m] = {err = tostring(e)} end
  end
  return out
end
local S = tonumber(ARGV[1])
local shape = {}
local a = 2
for j = 1, S do
  shape[j] = a + 1
  a = a + 1 + tonumber(ARGV[a])
end
-- a shape's limit and period as numbers, parsed once per call (plain checks), and the
-- algorithm's memo for them, by the shape's index as sent
local numbers = {}
local k, n = 1, #ARGV
local state, entry, denials, now, cost, need, c, limit, period, mode, after, within, dur,
  reason, okey, ov
-- The block list, read once for the whole call where it can be: when every check is plain
-- (or has the flags "x" alone), one EXISTS of all their block entries, and when none
-- exists no check reads its own (a PTTL each, ~3k instructions, where EXISTS costs well
-- under 1k a key). Exact: nothing else runs while a script does, and only a check with
-- flag `a` (not plain) writes a block entry.
local blocks = true
do
  local entries, b, kk = {}, a, 2
  while b <= n do
    local t = ARGV[b + 2]
    if t == 'x' then
      b = b + 5
    elseif string.byte(t) <= 57 then
      b = b + 3
    else
      entries = nil
      break
    end
    entries[#entries + 1] = KEYS[kk]
    kk = kk + 2
  end
  if entries and #entries >= 3 then blocks = rcall('EXISTS', unpack(entries)) > 0 end
end
while a <= n do
  local tag = ARGV[a + 2]
  local extra, step = '', 3
  if tag == 'x' then extra, tag, step = ARGV[a + 3], ARGV[a + 4], 5 end
  if step == 5 or string.byte(tag) <= 57 then
    -- a plain check (no flags: its shape, cost, tag; or with the flags "x" alone its
    -- shape, cost, "x", extra, tag: a concurrency lease, a window's shift), as
    -- check_plain.lua answers one: the block entry, the algorithm in mode check on the
    -- server clock, its reply built once (an admission of all units with no retry and no
    -- delay in short), the tag echoed as the string it came as
    -- (by the shape's index as it came: no number parsed per check)
    local ln = numbers[ARGV[a]]
    if ln == nil then
      local j = shape[tonumber(ARGV[a])]
      -- (then the algorithm's memo: prelude.lua; sized once, not grown)
      ln = {tonumber(ARGV[j]), tonumber(ARGV[j + 1]), false, false, false, false, false, false,
        false}
      numbers[ARGV[a]] = ln
    end
    local ttl = -2
    if blocks then ttl = rcall('PTTL', KEYS[k + 1]) end
    if ttl == -1 then
      m = m + 1
      out[m] = {0, 0, 0, -1, 0, 1, 0, tag}
    elseif ttl ~= -2 then
      m = m + 1
      out[m] = {0, 0, ttl * 1000, ttl * 1000, 0, 1, 0, tag}
    else
      if server_now == nil then server_now = clock('0') end
      cost = ARGV[a + 1]
      if cost == '1' then cost = 1 else cost = tonumber(cost) end
      local ok, r, remaining, reset, retry, delay = pcall(fn, KEYS[k], server_now, ln[1], ln[2],
        cost, false, extra, nil, ln)
      if not ok then
        m = m + 1
        if type(r) == 'table' and r.err then out[m] = r else out[m] = {err = tostring(r)} end
      elseif r == 1 then
        if retry == -1 and delay == 0 then
          out[m + 1], out[m + 2], out[m + 3] = remaining, reset, tag
          m = m + 3
        else
          m = m + 1
          out[m] = {1, remaining, reset, retry, delay, 0, cost, tag}
        end
      else
        m = m + 1
        out[m] = {0, remaining, reset, retry, delay, 0, 0, tag}
      end
    end
    k = k + 2
    a = a + step
  else
    local i
    k, i, state, entry, denials, now, cost, extra, need, c, limit, period, mode, after, within,
      dur, reason, okey, ov = parse(k, a + 1, shape[tonumber(ARGV[a])], code)
    local ok, r = pcall(check, state, entry, denials, now, cost, extra, need, c, limit, period,
      mode, after, within, dur, reason, okey, ov)
    if ok then
      r[#r + 1] = tonumber(ARGV[i])
      m = m + 1
      out[m] = r
    elseif type(r) == 'table' and r.err then
      m = m + 1
      out[m] = r
    else
      m = m + 1
      out[m] = {err = tostring(r)}
    end
    a = i + 1
  end
end
return out
