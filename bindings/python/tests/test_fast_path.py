"""The middlewares' lean path and what it must not lose: a reload that changes a policy's
algorithm is followed at once (a stale policy -> algorithm cache would check a policy turned
into a concurrency policy without a lease, and acquire a lease of a rate limit for the
reverse); the built-in ``policy=`` rule keys by client address
exactly as the Request-based rule does; the headers are the core's, rendered once; the
async calls are coroutines that asyncio's Task and ``await`` both drive. Against a real
Redis."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import httpx
import pytest
from redis_support import RedisServer, config
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from werkzeug.test import EnvironBuilder

import shardlimit
from shardlimit import Limiter, _http, wsgi
from shardlimit.asgi import RateLimitMiddleware

RATE = {"api": {"algorithm": "fixed_window", "limit": 100, "window": "1h"}}
CONCURRENT = {"api": {"algorithm": "concurrency", "max": 1, "lease_ttl": "30s"}}


def leases_held(redis: RedisServer) -> int:
    """Leases of CONCURRENT's "api" held in Redis for the test client (the core's count)."""
    lim = Limiter.from_json(config([redis], CONCURRENT))
    return 1 - lim.peek("ip:10.0.0.1", "api").remaining


def asgi_app(limiter: Limiter, gate: asyncio.Event, entered: list[int]) -> Any:
    async def slow(request: StarletteRequest) -> PlainTextResponse:
        entered.append(1)
        await gate.wait()
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", slow)])
    return RateLimitMiddleware(app, limiter, policy="api", warm_up=0)


@pytest.mark.parametrize("first, then", [(RATE, CONCURRENT), (CONCURRENT, RATE)])
def test_asgi_follows_a_reload_that_changes_the_algorithm(
    redis: RedisServer, first: dict[str, Any], then: dict[str, Any]
) -> None:
    limiter = Limiter.from_json(config([redis], first))

    async def main() -> list[int]:
        gate, entered = asyncio.Event(), list[int]()
        transport = httpx.ASGITransport(app=asgi_app(limiter, gate, entered),
                                        client=("10.0.0.1", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            gate.set()
            codes = [(await c.get("/")).status_code]  # learns the first algorithm
            limiter.reload(config([redis], then))
            gate.clear()
            task = asyncio.create_task(c.get("/"))
            deadline = asyncio.get_running_loop().time() + 5
            while not entered[1:] and not task.done():
                assert asyncio.get_running_loop().time() < deadline, "timed out"
                await asyncio.sleep(0)
            if then is CONCURRENT:
                # the new policy is a concurrency policy: the request holds a lease and a
                # second one is refused while it runs
                assert leases_held(redis) == 1
                codes.append((await c.get("/")).status_code)
            gate.set()
            codes.append((await task).status_code)
            assert leases_held(redis) == 0
        return codes

    codes = asyncio.run(main())
    assert codes == ([200, 429, 200] if then is CONCURRENT else [200, 200])


@pytest.mark.parametrize("first, then", [(RATE, CONCURRENT), (CONCURRENT, RATE)])
def test_wsgi_follows_a_reload_that_changes_the_algorithm(
    redis: RedisServer, first: dict[str, Any], then: dict[str, Any]
) -> None:
    limiter = Limiter.from_json(config([redis], first))

    def app(env: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    mw = wsgi.RateLimitMiddleware(app, limiter, policy="api", warm_up=0)

    def call() -> tuple[str, Any]:
        status: list[str] = []

        def start_response(s: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            status.append(s)
            return lambda b: None

        env = EnvironBuilder(path="/", environ_base={"REMOTE_ADDR": "10.0.0.1"}).get_environ()
        body = mw(env, start_response)
        return status[0], body

    s, body = call()
    assert s == "200 OK"
    getattr(body, "close", lambda: None)()
    limiter.reload(config([redis], then))
    s, body = call()
    assert s == "200 OK"
    if then is CONCURRENT:
        assert leases_held(redis) == 1
        assert call()[0].startswith("429")  # the one lease is held
    getattr(body, "close", lambda: None)()
    assert leases_held(redis) == 0


def test_the_config_generation_moves_with_reloads(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], RATE))
    g = limiter._config_generation
    assert limiter._config_generation == g  # nothing changed
    limiter.reload(config([redis], CONCURRENT))
    g2 = limiter._config_generation
    assert g2 != g
    limiter.reload(config([redis], RATE))
    assert limiter._config_generation not in (g, g2)


def test_the_ip_rule_without_a_request_keys_as_the_request_rule(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], RATE))
    for proxies in ([], ["10.0.0.0/8"]):
        checker = _http.Checker(limiter, None, "api", proxies)
        assert checker.by_ip is not None
        for peer, xff in [("10.1.2.3", None), ("10.1.2.3", "203.0.113.9"),
                          ("::ffff:192.0.2.1", None), ("2001:db8::1", "198.51.100.2"),
                          ("2001:db8::2", None), ("unix-socket", None), (None, None)]:
            headers = {} if xff is None else {"x-forwarded-for": xff}
            expected = checker.rule(checker.request("GET", "/", headers, peer, None))
            for _ in range(2):  # computed, then remembered
                assert checker.ip_target(peer, xff) == expected, (proxies, peer, xff)
    # the cache is bounded
    checker = _http.Checker(limiter, None, "api", [])
    for i in range(_http.IP_CACHE + 10):
        checker.ip_target(f"10.0.{i // 256}.{i % 256}", None)
    assert len(checker._ip_keys) <= _http.IP_CACHE


def test_wire_headers_are_the_core_headers_as_options_ask(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], RATE))
    d = limiter.check("k", "api")
    core = d.headers()
    now = 1_700_000_000.75
    both = dict(d._wire_headers(True, True, now, False))
    reset = math.ceil(d.reset_after)
    assert abs(int(core["X-RateLimit-Reset"]) - (time.time() + reset)) <= 2  # a Unix time
    assert both == {**core, "X-RateLimit-Reset": str(math.ceil(now + d.reset_after))}
    assert list(both) == list(core)  # the core's order
    raw = d._wire_headers(True, True, now, True)
    assert raw == [(k.lower().encode(), v.encode()) for k, v in both.items()]
    assert dict(d._wire_headers(False, True, now, False)) == {
        k: v for k, v in core.items() if k in ("RateLimit", "RateLimit-Policy")}
    assert [k for k, _ in d._wire_headers(True, False, now, False)] == [
        "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"]
    assert d._wire_headers(False, False, now, False) == []
    # a denial keeps its Retry-After in every set
    deny = Limiter.memory().check("k", "1/hour", 2)
    assert not deny.allowed
    for x, ietf in [(True, True), (False, False)]:
        assert ("Retry-After" in dict(deny._wire_headers(x, ietf, now, False))) == (
            "Retry-After" in deny.headers())
    opts = _http.Options()
    assert _http.raw_rate_headers(d, opts)[2][0] == b"x-ratelimit-reset"
    assert abs(int(_http.raw_rate_headers(d, opts)[2][1]) - (time.time() + reset)) <= 2


def test_async_calls_are_coroutines_for_await_tasks_and_asyncio_run(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], RATE))
    coro = limiter.acheck("k", "api")
    assert asyncio.iscoroutine(coro)
    assert asyncio.run(coro).remaining == 99  # driven by asyncio.run's Task (send/throw)

    async def main() -> None:
        assert (await limiter.acheck("k", "api")).remaining == 98  # driven by __await__
        task = asyncio.ensure_future(limiter.acheck("k", "api"))
        assert (await task).remaining == 97
        results = await asyncio.gather(*(limiter.acheck("k", "api") for _ in range(3)))
        assert sorted(r.remaining for r in results) == [94, 95, 96]
        c = limiter.acheck("k", "api")
        await c
        with pytest.raises(RuntimeError, match="awaited already"):
            await c
        # a coroutine closed before it ran makes no call
        never = limiter.acheck("k", "api")
        never.close()
        with pytest.raises(RuntimeError, match="awaited already"):
            await never
        # cancelled while waiting: the task ends cancelled, the limiter keeps working
        task = asyncio.ensure_future(limiter.acheck("k", "api"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await limiter.apeek("k", "api")).allowed
        # an error is raised by the await, as the core's kind
        with pytest.raises(shardlimit.UnknownPolicyError):
            await limiter.acheck("k", "nope")

    asyncio.run(main())


def test_throw_into_an_unstarted_call_raises_it() -> None:
    limiter = Limiter.memory()
    coro: Any = limiter.acheck("k", "5/minute")
    with pytest.raises(ValueError, match="boom"):
        coro.throw(ValueError("boom"))
    with pytest.raises(ValueError):
        coro.throw(ValueError)
