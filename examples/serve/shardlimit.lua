-- An HAProxy action asking `shardlimit serve`'s /auth endpoint (HAProxy >= 2.5, for
-- core.httpclient). Load it with `lua-load shardlimit.lua` and call
-- `http-request lua.shardlimit <policy>` after setting txn.rl_key; it sets:
--   txn.rl_status     the endpoint's status (200 allowed, 429 denied), unset on error
--   txn.rl_retry      Retry-After of a denial
--   txn.rl_limit, txn.rl_remaining, txn.rl_reset   the X-RateLimit-* headers
-- The service's address comes from the SHARDLIMIT_SERVE environment variable (read at
-- each call: `setenv` in the global section may come after `lua-load`).

local function encode(s)
  return (string.gsub(s, "[^%w%-%._~]", function(c)
    return string.format("%%%02X", string.byte(c))
  end))
end

local function header(res, name)
  local h = res.headers and res.headers[name]
  if h == nil then return nil end
  return h[0]
end

core.register_action("shardlimit", { "http-req" }, function(txn, policy)
  local serve = os.getenv("SHARDLIMIT_SERVE") or "http://127.0.0.1:8080"
  local key = txn:get_var("txn.rl_key") or ""
  local res = core.httpclient():get{
    url = serve .. "/auth?deny_status=429&policy=" .. encode(policy) .. "&key=" .. encode(key),
    timeout = 100,
  }
  if res == nil or res.status == nil or res.status == 0 then
    return -- unreachable: the rules decide (fail open unless they deny on a missing status)
  end
  txn:set_var("txn.rl_status", res.status)
  for var, name in pairs({ rl_retry = "retry-after", rl_limit = "x-ratelimit-limit",
                           rl_remaining = "x-ratelimit-remaining", rl_reset = "x-ratelimit-reset" }) do
    local v = header(res, name)
    if v ~= nil then txn:set_var("txn." .. var, v) end
  end
end, 1)
