"""Live per-key overrides through the Python API: sync and asyncio, memory and Redis, and
two limiters on one Redis (two processes): what one sets, the other's next check uses."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

import pytest
from flask import Flask
from redis_support import RedisServer, config

from shardlimit import InvalidArgumentError, Limiter, ManualClock, UnknownPolicyError, wsgi
from shardlimit._http import Request, Target

POLICIES = {
    "api": {"algorithm": "fixed_window", "limit": 3, "window": "1h", "overrides": True},
    "plain": {"algorithm": "fixed_window", "limit": 3, "window": "1h"},
}


def test_memory_engine_on_a_manual_clock() -> None:
    clock = ManualClock(1_000_000)
    limiter = Limiter.from_json(json.dumps({"policies": POLICIES}), clock=clock)
    assert limiter.check("t", "api").limit == 3
    info = limiter.set_override("t", "api", "10/hour", ttl=5)
    assert info == {
        "key": "t",
        "policy": "api",
        "limit": {"algorithm": "fixed_window", "limit": 10, "window": "3600000ms"},
        "remaining_ms": 5000,
    }
    d = limiter.check("t", "api")
    assert (d.limit, d.remaining, d.policy) == (10, 8, "api")
    clock.advance_us(5_000_000)  # the TTL ends on the injected clock
    assert limiter.check("t", "api").limit == 3
    assert limiter.get_override("t", "api") is None
    # a dict is a limit object
    limiter.set_override("t", "api", {"algorithm": "token_bucket", "capacity": 4, "refill_per_sec": 1})
    d = limiter.check("t", "api")
    assert (d.limit, d.remaining) == (4, 3)


def test_two_limiters_on_redis(redis: RedisServer) -> None:
    a = Limiter.from_json(config([redis], POLICIES))
    b = Limiter.from_json(config([redis], POLICIES))
    assert b.check("acme", "api").limit == 3
    a.set_override("acme", "api", "100/hour", ttl=3600)
    d = b.check("acme", "api")
    assert (d.limit, d.remaining) == (100, 98)
    got = b.get_override("acme", "api")
    assert got is not None and got["limit"]["limit"] == 100
    assert 0 < (got["remaining_ms"] or 0) <= 3_600_000
    a.set_override("globex", "api", '{"limit": 7, "window": "1h"}')
    keys: list[str] = []
    cursor = None
    while True:
        page = b.list_overrides("api", cursor, 1)
        keys += [o["key"] for o in page["overrides"]]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert sorted(keys) == ["acme", "globex"]
    assert a.delete_override("acme", "api") is True
    assert a.delete_override("acme", "api") is False
    assert b.check("acme", "api").limit == 3


def test_asyncio_twins(redis: RedisServer) -> None:
    a = Limiter.from_json(config([redis], POLICIES))
    b = Limiter.from_json(config([redis], POLICIES))

    async def main() -> None:
        await a.aset_override("k", "api", "50/hour")
        assert (await b.acheck("k", "api")).limit == 50
        got = await b.aget_override("k", "api")
        assert got is not None and got["limit"]["limit"] == 50
        page = await b.alist_overrides("api")
        assert [o["key"] for o in page["overrides"]] == ["k"] and page["cursor"] is None
        assert await a.adelete_override("k", "api")
        assert (await b.acheck("k", "api")).limit == 3
        assert await b.aget_override("k", "api") is None

    asyncio.run(main())


def test_errors_name_what_is_wrong() -> None:
    limiter = Limiter.from_json(json.dumps({"policies": POLICIES}))
    with pytest.raises(InvalidArgumentError, match="takes no per-key overrides"):
        limiter.set_override("k", "plain", "5/minute")
    with pytest.raises(InvalidArgumentError, match="nor a plan of the config"):
        limiter.set_override("k", "api", "gold")
    with pytest.raises(InvalidArgumentError, match="an array of 1 to 16"):
        limiter.set_override("k", "api", "[]")
    with pytest.raises(InvalidArgumentError, match="`ttl`"):
        limiter.set_override("k", "api", "5/minute", ttl=-1)
    with pytest.raises(InvalidArgumentError, match="`limit`"):
        limiter.set_override("k", "api", 5)  # type: ignore[arg-type]
    with pytest.raises(UnknownPolicyError):
        limiter.get_override("k", "nope")


def test_an_override_of_several_limits_reaches_the_core_unchanged(redis: RedisServer) -> None:
    """A rate string of several limits and a plan name whose policy holds several: the
    key's whole limit set, on the next check of another limiter (another process)."""
    policies = {
        **POLICIES,
        "multi": {"rate": "2/second; 100/day", "overrides": True},
    }
    cfg = json.loads(config([redis], policies))
    cfg["plans"] = {"pro": {"api": "4/second; 5/day"}}
    a = Limiter.from_json(json.dumps(cfg), clock=ManualClock(1_700_000_000_000_000))
    b = Limiter.from_json(json.dumps(cfg), clock=ManualClock(1_700_000_000_000_000))
    info = a.set_override("t", "multi", "3/second; 10/day")
    assert [lim["limit"] for lim in info["limits"]] == [3, 10]
    assert [b.check("t", "multi").allowed for _ in range(4)] == [True, True, True, False]
    d = b.check("t", "multi")
    assert (d.limit, [q[0] for q in d.quotas]) == (3, [3, 10])
    a.set_override("u", "api", "pro")
    assert [b.check("u", "api").allowed for _ in range(5)] == [True] * 4 + [False]
    got = b.get_override("u", "api")
    assert got is not None and [lim["limit"] for lim in got["limits"]] == [4, 5]


def test_a_layered_middleware_rule_limits_a_tenant_as_its_override(redis: RedisServer) -> None:
    """A WSGI rule of two layers (tenant, IP) on a policy with overrides: a tenant moved from
    free to pro by another limiter (another process) is limited as pro by the layered rule,
    and a denial consumes nothing in the IP layer."""
    policies = {
        "free": {"algorithm": "fixed_window", "limit": 2, "window": "1h", "overrides": True},
        "ip": {"algorithm": "fixed_window", "limit": 100, "window": "1h"},
    }
    a = Limiter.from_json(config([redis, redis], policies), clock=ManualClock(1_800_000_000_000_000))
    b = Limiter.from_json(config([redis, redis], policies))

    def rule(request: Request) -> Optional[Target]:
        return [(request.headers.get("x-tenant", "anon"), "free"), (f"ip:{request.client_ip}", "ip")]

    app = Flask("layered-overrides")

    @app.get("/")
    def hello() -> str:
        return "hi"

    app.wsgi_app = wsgi.RateLimitMiddleware(app.wsgi_app, a, rule)  # type: ignore[method-assign]
    client = app.test_client()

    def get(tenant: str) -> int:
        return client.get("/", headers={"X-Tenant": tenant}).status_code

    assert [get("acme") for _ in range(3)] == [200, 200, 429]
    # another process moves acme to pro: 5 an hour, 2 of them used
    b.set_override("acme", "free", "5/hour")
    assert [get("acme") for _ in range(4)] == [200, 200, 200, 429]
    # an override of several limits: each of its limits decides
    b.set_override("globex", "free", "10/hour; 3/day")
    assert [get("globex") for _ in range(4)] == [200, 200, 200, 429]
    d = a.check_all([("globex", "free"), ("ip:x", "ip")])
    assert not d and d.layer == 0 and d.limit == 3 and d.limit_index == 1
    # 5 + 3 admitted in the IP layer (the client's address), no denied request counted
    assert a.peek("ip:127.0.0.1", "ip").remaining == 100 - 2 - 3 - 3
