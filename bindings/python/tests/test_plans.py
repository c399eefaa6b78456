"""Multi-limit policies, plans and rate strings of the config, from Python: the core
decides (one script call per check), the binding converts; headers are the core's."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Limiter, ManualClock

T0 = 1_700_006_400_000_000  # the start of a day (UTC), in µs

POLICIES = {
    "api": "2/second; 3/minute",
    "login": {"algorithm": "sliding_log", "rate": "5/minute", "on_error": "closed"},
}
PLANS = {"pro": {"api": {"limits": ["10/second", "100/minute"]}}}


def check_multi(limiter: Limiter, clock: ManualClock) -> None:
    api = limiter.policy("api")
    assert [(l.algorithm, l.id) for l in api.limits] == [
        ("fixed_window", "fixed_window-2-1000ms"),
        ("fixed_window", "fixed_window-3-60000ms"),
    ]
    d = limiter.check("u", "api", 2)
    assert d.allowed and d.limit_index == 0 and d.quotas == [(2, 1.0), (3, 60.0)]
    headers = d.headers()
    assert headers["RateLimit-Policy"] == '"api";q=2;w=1, "api#1";q=3;w=60'
    assert headers["RateLimit"] == '"api";r=0;t=1'
    clock.set_us(T0 + 1_000_000)
    d = limiter.check("u", "api", 2)
    # the minute denies; nothing was taken from the second
    assert not d.allowed and d.limit_index == 1 and d.limit == 3
    assert d.headers()["RateLimit"] == '"api#1";r=1;t=59'
    assert d.to_dict()["limit_index"] == 1
    assert limiter.peek("u", "api").remaining == 1
    # under a plan: the same name, so the same keys and headers
    pro = limiter.plan_policy("pro", "api")
    assert pro.name == "api" and len(pro.limits) == 2
    d = limiter.check("u", pro, 2)
    assert d.allowed and d.policy == "api" and d.quotas == [(10, 1.0), (100, 60.0)]
    assert limiter.plan_policy("pro", "login").limits[0].algorithm == "sliding_log"
    with pytest.raises(shardlimit.InvalidArgumentError, match="gold"):
        limiter.plan_policy("gold", "api")
    with pytest.raises(shardlimit.UnknownPolicyError):
        limiter.plan_policy("pro", "nope")
    assert limiter.policy("login").on_error == "closed"


def test_multi_limit_policies_and_plans_in_memory() -> None:
    clock = ManualClock(T0)
    cfg = {"policies": POLICIES, "plans": PLANS}
    check_multi(Limiter.from_json(json.dumps(cfg), clock=clock), clock)


def test_multi_limit_policies_and_plans_on_redis(redis: RedisServer) -> None:
    clock = ManualClock(T0)
    limiter = Limiter.from_json(config([redis], POLICIES, plans=PLANS), clock=clock)
    check_multi(limiter, clock)


def test_async_checks_under_a_plan_on_redis(redis: RedisServer) -> None:
    clock = ManualClock(T0)
    limiter = Limiter.from_json(config([redis], POLICIES, plans=PLANS), clock=clock)
    pro = limiter.plan_policy("pro", "api")

    async def main() -> list[shardlimit.Decision]:
        return [await limiter.acheck("k", pro) for _ in range(11)]

    ds = asyncio.run(main())
    assert [d.allowed for d in ds] == [True] * 10 + [False]
    assert ds[-1].limit_index == 0 and ds[-1].source == "redis"


def test_config_errors_name_the_field() -> None:
    with pytest.raises(shardlimit.ConfigError, match=r"policies\.login: .*fortnight"):
        Limiter.from_json(json.dumps({"policies": {"login": "5/fortnight"}}))
    with pytest.raises(shardlimit.ConfigError, match=r"plans\.free\.upload: no policy"):
        Limiter.from_json(
            json.dumps({"policies": POLICIES, "plans": {"free": {"upload": "1/second"}}})
        )
