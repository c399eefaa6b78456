"""The Python API: Decision, Limit, Policy, leases and their context managers, routing,
reset and peek, the manual clock, and the version."""

from __future__ import annotations

import asyncio
import json
import re
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Decision, Limit, Limiter, ManualClock, Policy, RateLimitExceeded

T0 = 1_800_000_000_000_000
POLICIES = {
    "login": {"algorithm": "fixed_window", "limit": 2, "window": "10s", "on_error": "closed"},
    "db": {"algorithm": "concurrency", "max": 2, "lease_ttl": "30s"},
    "upload": {"algorithm": "leaky_bucket", "capacity": 3, "leak_per_sec": 2},
}


@pytest.fixture(params=["memory", "redis"])
def limiter(request: pytest.FixtureRequest) -> tuple[Limiter, ManualClock]:
    clock = ManualClock(T0)
    if request.param == "memory":
        return Limiter.from_json(json.dumps({"policies": POLICIES}), clock=clock), clock
    server: RedisServer = request.getfixturevalue("redis")
    return Limiter.from_json(config([server], POLICIES), clock=clock), clock


def test_version_is_the_workspace_version() -> None:
    cargo = (Path(__file__).resolve().parents[3] / "Cargo.toml").read_text()
    section = cargo.split("[workspace.package]", 1)[1]
    m = re.search(r'^version\s*=\s*"([^"]+)"', section, re.M)
    assert m is not None
    assert shardlimit.__version__ == m.group(1) == version("shardlimit")


def test_decision(limiter: tuple[Limiter, ManualClock]) -> None:
    lim, clock = limiter
    first = lim.check("u", "login")
    assert isinstance(first, Decision) and bool(first) and first.allowed
    assert (first.limit, first.remaining, first.policy) == (2, 1, "login")
    assert first.reset_after == 10.0 and first.retry_after is None and first.delay == 0.0
    assert first.window == 10.0
    # X-RateLimit-Reset: the Unix time of the reset (wall clock now + 10 s), the same in
    # every language and middleware; RateLimit's t keeps delta seconds
    wall = time.time()
    h = first.headers()
    assert int(wall) + 9 <= int(h["X-RateLimit-Reset"]) <= int(wall) + 11, (h, wall)
    assert h == {
        "X-RateLimit-Limit": "2",
        "X-RateLimit-Remaining": "1",
        "X-RateLimit-Reset": h["X-RateLimit-Reset"],
        "RateLimit-Policy": '"login";q=2;w=10',
        "RateLimit": '"login";r=1;t=10',
    }
    clock.advance_us(2_500_000)
    assert lim.check("u", "login", cost=1)
    denied = lim.check("u", "login")
    assert not denied and denied.retry_after == 7.5 and denied.reset_after == 7.5
    assert denied.headers()["Retry-After"] == "8"
    body = denied.body()
    assert body["error"] == "rate_limited" and body["retry_after"] == 8
    assert body["message"] == 'Rate limit exceeded for policy "login": retry in 8 seconds.'
    assert denied.to_dict()["retry_after_ms"] == 7500.0
    assert '"allowed":false' in denied.to_json()
    assert "allowed=False" in repr(denied)
    with pytest.raises(AttributeError):
        denied.allowed = True  # type: ignore[misc]
    assert denied == denied and denied != first


def test_leaky_bucket_delay(limiter: tuple[Limiter, ManualClock]) -> None:
    lim, _ = limiter
    delays = [lim.check("u", "upload").delay for _ in range(3)]
    assert delays == [0.0, 0.5, 1.0]
    assert not lim.check("u", "upload")


def test_peek_and_reset(limiter: tuple[Limiter, ManualClock]) -> None:
    lim, _ = limiter
    assert lim.peek("u", "login").remaining == 2
    lim.check("u", "login", 2)
    assert not lim.peek("u", "login").allowed
    lim.reset("u", "login")
    assert lim.peek("u", "login").remaining == 2


def test_ad_hoc_limits_and_policies(limiter: tuple[Limiter, ManualClock]) -> None:
    lim, _ = limiter
    lim_ = Limit.token_bucket(3, 1.5)
    assert (lim_.algorithm, lim_.id) == ("token_bucket", "token_bucket-3-1.5ps")
    assert lim.check("u", lim_).policy == lim_.id
    p = Policy("search", Limit.sliding_window(10, 60), on_error="local")
    assert (p.name, p.algorithm, p.max, p.on_error) == ("search", "sliding_window", 10, "local")
    assert lim.check("u", p).remaining == 9
    login = lim.policy("login")
    assert (login.name, login.max, login.on_error) == ("login", 2, "closed")
    assert lim.check("u", login).remaining == 1
    assert lim.policies == ["db", "login", "upload"]


def test_acquire_and_release(limiter: tuple[Limiter, ManualClock]) -> None:
    lim, _ = limiter
    d1, a = lim.acquire("conn", "db")
    d2, b = lim.acquire("conn", "db")
    d3, c = lim.acquire("conn", "db")
    assert a is not None and b is not None and c is None
    assert (d1.remaining, d2.remaining, bool(d3)) == (1, 0, False)
    assert (a.key, a.policy, a.units) == ("conn", "db", 1) and a.id != b.id
    assert a.decision == d1
    assert lim.release(a) is True
    assert lim.release(a) is False
    assert lim.acquire("conn", "db", units=1)[1] is not None


def test_lease_context_manager(limiter: tuple[Limiter, ManualClock]) -> None:
    lim, _ = limiter
    with lim.lease("conn", "db") as lease:
        assert lease.policy == "db" and lim.peek("conn", "db").remaining == 1
        with lim.lease("conn", "db"):
            with pytest.raises(RateLimitExceeded) as e:
                with lim.lease("conn", "db"):
                    raise AssertionError("must not run")
            assert not e.value.decision and e.value.decision.policy == "db"
    assert lim.peek("conn", "db").remaining == 2
    with pytest.raises(KeyError):
        with lim.lease("conn", "db", 2):
            assert lim.peek("conn", "db").remaining == 0
            raise KeyError("released anyway")
    assert lim.peek("conn", "db").remaining == 2


def test_async_lease_context_manager(limiter: tuple[Limiter, ManualClock]) -> None:
    lim, _ = limiter

    async def main() -> None:
        async with lim.lease("conn", "db") as lease:
            assert lease.units == 1
            assert (await lim.apeek("conn", "db")).remaining == 1
            async with lim.lease("conn", "db"):
                with pytest.raises(RateLimitExceeded):
                    async with lim.lease("conn", "db"):
                        raise AssertionError("must not run")
        assert (await lim.apeek("conn", "db")).remaining == 2
        decision, lease2 = await lim.aacquire("conn", "db", 2)
        assert decision and lease2 is not None
        assert await lim.arelease(lease2) is True
        await lim.areset("conn", "db")

    asyncio.run(main())


def test_route(redis: RedisServer) -> None:
    assert Limiter.memory().route("k") is None
    lim = Limiter.from_json(config([redis, redis], {}))
    # the routing contract (tests/vectors/routing.json): hash tags route together
    assert lim.route("{user:1}:a") == lim.route("{user:1}:b")
    idx, name = lim.route("user:1") or (None, None)
    assert idx in (0, 1) and name == f"s{idx}"
    routing = Path(__file__).resolve().parents[3] / "tests" / "vectors" / "routing.json"
    for case in json.loads(routing.read_text())["cases"]:
        want = case["shard_for"][1]  # among two shards
        assert lim.route(case["key"]) == (want, f"s{want}"), case["key"]
    assert lim.is_redis and not Limiter.memory().is_redis


def test_manual_clock() -> None:
    c = ManualClock()
    assert c.now_us() == 0
    c.set_us(T0)
    c.advance_us(5)
    assert c.now_us() == T0 + 5
