-- shardlimit: the override comparison, written once for every script that decides under a
-- key's override (check.lua, so main_check, main_batch and main_settle; main_layered;
-- main_settle_multi). Assembled after the prelude by core/src/engine/redis/scripts.rs.
-- override_changed(okey, ov, j): the key's override entry at `okey` ("<version> <limit>",
-- see overrides.rs) against the version `ov` the client decided with ("" for none). nil
-- when they agree; else the reply {'o', entry, j} (entry "" when the key has none), and
-- the script decides nothing: the client calls again with the entry.
local function override_changed(okey, ov, j)
  local o = rcall('GET', okey)
  if o then
    local sp = string.find(o, ' ', 1, true)
    if not sp or string.sub(o, 1, sp - 1) ~= ov then return {'o', o, j} end
  elseif ov ~= '' then
    return {'o', '', j}
  end
  return nil
end
