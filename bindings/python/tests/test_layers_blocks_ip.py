"""Layered checks, the block list and the trusted-proxy client_ip helper, through the
Python API (memory and Redis engines) and through both middlewares."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

import httpx
import pytest
from flask import Flask
from redis_support import RedisServer, config
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import shardlimit
from shardlimit import Limiter, ManualClock, TrustedProxies, asgi, wsgi
from shardlimit._http import Layer, Request, Target

T0 = 1_800_000_000_000_000
POLICIES = {
    "ip": {"algorithm": "fixed_window", "limit": 3, "window": "1m"},
    "key": {"algorithm": "fixed_window", "limit": 2, "window": "1m"},
    "tenant": {"algorithm": "token_bucket", "capacity": 10, "refill_per_sec": 1},
}


@pytest.fixture(params=["memory", "redis"])
def engine(request: pytest.FixtureRequest) -> tuple[Limiter, ManualClock]:
    clock = ManualClock(T0)
    if request.param == "memory":
        return Limiter.from_json(json.dumps({"policies": POLICIES}), clock=clock), clock
    server: RedisServer = request.getfixturevalue("redis")
    return Limiter.from_json(config([server, server], POLICIES), clock=clock), clock


def test_layered_check_consumes_all_or_nothing(engine: tuple[Limiter, ManualClock]) -> None:
    lim, _ = engine
    layers: list[Layer] = [("ip:1", "ip"), ("key:1", "key", 1), ("tenant:1", "tenant", 2)]
    first = lim.check_all(layers)
    assert first and first.layer == 1 and first.policy == "key" and first.remaining == 1
    assert lim.check_all(layers)
    denied = lim.check_all(layers)
    assert not denied and denied.layer == 1 and denied.retry_after == 60.0
    # the denied check consumed nothing in any layer
    assert lim.peek("ip:1", "ip").remaining == 1
    assert lim.peek("tenant:1", "tenant").remaining == 6
    # the IP alone still has one unit
    assert lim.check("ip:1", "ip").remaining == 0


def test_layered_check_async(engine: tuple[Limiter, ManualClock]) -> None:
    lim, _ = engine

    async def main() -> list[bool]:
        return [bool(await lim.acheck_all([("ip:2", "ip"), ("key:2", "key")]))
                for _ in range(3)]

    assert asyncio.run(main()) == [True, True, False]


def test_layered_check_bad_input(engine: tuple[Limiter, ManualClock]) -> None:
    lim, _ = engine
    with pytest.raises(shardlimit.InvalidArgumentError, match="layers"):
        lim.check_all([])
    with pytest.raises(TypeError):
        lim.check_all("ip")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        lim.check_all([("k",)])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        lim.check_all([["k", "ip"]])  # type: ignore[list-item]
    with pytest.raises(shardlimit.UnknownPolicyError):
        lim.check_all([("k", "ip"), ("k", "nope")])
    with pytest.raises(shardlimit.InvalidArgumentError, match="cost"):
        lim.check_all([("k", "ip", 0)])


def test_block_list(engine: tuple[Limiter, ManualClock]) -> None:
    lim, clock = engine
    assert lim.blocked("abuser") is None
    lim.block("abuser", ttl=30, reason="credential stuffing")
    info = lim.blocked("abuser")
    assert info is not None and info.reason == "credential stuffing"
    assert info.remaining is not None and 0 < info.remaining <= 30
    d = lim.check("abuser", "ip")
    assert not d and d.source == "block" and d.retry_after is not None
    assert d.headers()["Retry-After"] == "30"
    assert lim.unblock("abuser") is True
    assert lim.unblock("abuser") is False
    assert lim.check("abuser", "ip")
    lim.block("forever")
    info = lim.blocked("forever")
    assert info is not None and info.remaining is None and info.reason == ""
    assert not lim.check("forever", "ip")
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(shardlimit.InvalidArgumentError, match="ttl"):
            lim.block("x", ttl=bad)


def test_block_list_async(engine: tuple[Limiter, ManualClock]) -> None:
    lim, _ = engine

    async def main() -> None:
        await lim.ablock("a", 60, "r")
        info = await lim.ablocked("a")
        assert info is not None and info.reason == "r"
        assert not await lim.acheck("a", "key")
        assert await lim.aunblock("a") is True
        assert await lim.ablocked("a") is None

    asyncio.run(main())


PROXIES = ["10.0.0.0/8", "192.168.1.1", "2001:db8::/32"]


@pytest.mark.parametrize(
    "peer, xff, want",
    [
        ("203.0.113.9:4431", "1.1.1.1", "203.0.113.9"),  # untrusted peer: header ignored
        ("10.0.0.5:80", "6.6.6.6, 198.51.100.7", "198.51.100.7"),  # spoofed left entry
        ("10.0.0.5", "6.6.6.6, 198.51.100.7, 192.168.1.1", "198.51.100.7"),
        ("10.0.0.1", None, "10.0.0.1"),
        ("[2001:db8::1]:443", "2001:db9::5", "2001:db9::5"),
    ],
)
def test_client_ip(peer: str, xff: Optional[str], want: str) -> None:
    assert shardlimit.client_ip(peer, xff, PROXIES) == want
    assert TrustedProxies(PROXIES).client_ip(peer, xff) == want


@pytest.mark.parametrize(
    "ip, prefix, want",
    [
        ("2001:db8:1:2::1", 64, "2001:db8:1:2::/64"),
        ("[2001:0db8:0001:0002:ffff::9]:443", 64, "2001:db8:1:2::/64"),
        ("2001:db8:1:2::abcd%eth0", 64, "2001:db8:1:2::/64"),
        ("2001:db8:1:2ff::1", 56, "2001:db8:1:200::/56"),
        ("2001:db8::1", 128, "2001:db8::1"),
        ("::ffff:203.0.113.9", 64, "203.0.113.9"),
        ("203.0.113.9:80", 64, "203.0.113.9"),
    ],
)
def test_ip_key_aggregates_ipv6(ip: str, prefix: int, want: str) -> None:
    assert shardlimit.ip_key(ip, prefix) == want


def test_ip_key_bad_input() -> None:
    with pytest.raises(shardlimit.InvalidArgumentError, match="peer_addr"):
        shardlimit.ip_key("nope")
    with pytest.raises(shardlimit.InvalidArgumentError, match="ipv6_prefix"):
        shardlimit.ip_key("::1", 0)
    with pytest.raises(shardlimit.InvalidArgumentError, match="ipv6_prefix"):
        shardlimit.ip_key("::1", 129)


def test_client_ip_bad_input() -> None:
    with pytest.raises(shardlimit.InvalidArgumentError, match="peer_addr"):
        shardlimit.client_ip("nope")
    with pytest.raises(shardlimit.InvalidArgumentError, match="trusted_proxies"):
        TrustedProxies(["10.0.0.0/33"])
    assert "10.1.2.3" in TrustedProxies(PROXIES) and "11.0.0.1" not in TrustedProxies(PROXIES)


# ---------------------------------------------------------------- through the middlewares

def layered_rule(request: Request) -> Optional[Target]:
    return [(f"ip:{request.client_ip}", "ip"), (request.headers.get("x-api-key", "anon"), "key")]


def test_asgi_uses_trusted_proxies_and_layers(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES))
    seen: list[Optional[str]] = []

    async def hello(request: StarletteRequest) -> PlainTextResponse:
        return PlainTextResponse("hi")

    def rule(request: Request) -> Optional[Target]:
        seen.append(request.client_ip)
        return layered_rule(request)

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter, rule=rule,
                       trusted_proxies=["10.0.0.0/8"])

    async def get(peer: str, xff: str, key: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(peer, 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get("/", headers={"x-forwarded-for": xff, "x-api-key": key})

    async def main() -> list[int]:
        codes = []
        # behind our proxy 10.0.0.5 the client is the right-most untrusted address
        for key in ("k1", "k1", "k1"):
            codes.append((await get("10.0.0.5", "6.6.6.6, 198.51.100.7", key)).status_code)
        # the denied check consumed no IP unit: one is left (of 3), then none whatever the key
        codes.append((await get("10.0.0.5", "198.51.100.7", "k2")).status_code)
        codes.append((await get("10.0.0.5", "198.51.100.7", "k2")).status_code)
        # an untrusted peer cannot choose its address with the header
        codes.append((await get("203.0.113.1", "198.51.100.7", "k3")).status_code)
        return codes

    # k1 allows 2: the third is denied by the key layer
    assert asyncio.run(main()) == [200, 200, 429, 200, 429, 200]
    assert seen[:5] == ["198.51.100.7"] * 5 and seen[5] == "203.0.113.1"


def test_wsgi_uses_trusted_proxies_and_layers(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES))
    app = Flask("layers")

    @app.get("/")
    def hello() -> str:
        return "hi"

    app.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter, layered_rule, trusted_proxies=["10.0.0.0/8"]
    )
    client = app.test_client()

    def get(peer: str, xff: str, key: str) -> int:
        return client.get("/", environ_base={"REMOTE_ADDR": peer},
                          headers={"X-Forwarded-For": xff, "X-Api-Key": key}).status_code

    codes = [get("10.0.0.5", "6.6.6.6, 198.51.100.7", "k1") for _ in range(3)]
    codes.append(get("10.0.0.5", "198.51.100.7", "k2"))
    codes.append(get("10.0.0.5", "198.51.100.7", "k2"))
    codes.append(get("203.0.113.1", "198.51.100.7", "k3"))
    assert codes == [200, 200, 429, 200, 429, 200]
