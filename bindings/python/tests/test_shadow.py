"""Shadow mode and near-limit events from Python, on a real Redis: a policy in shadow and
the per-call ``check_shadow`` (sync and asyncio), the shadow counts read back with
``shadow_report``, the events, and shadow end to end through every middleware (ASGI on
Starlette and FastAPI, WSGI on Flask, FastAPI route limits): a shadow-denied request goes
through with no 429 and no header that says it is limited."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from flask import Flask
from redis_support import RedisServer, config
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import shardlimit
from shardlimit import Limiter, asgi, wsgi
from shardlimit._http import Request

POLICIES = {
    "new": {"algorithm": "fixed_window", "limit": 1, "window": "1h", "shadow": True},
    "old": {"algorithm": "fixed_window", "limit": 1, "window": "1h"},
    "plan": {"algorithm": "fixed_window", "limit": 10, "window": "1h", "near_limit": 0.5},
}
LIMITED = {"retry-after", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit"}


@pytest.fixture
def limiter(redis: RedisServer) -> Limiter:
    return Limiter.from_json(config([redis], POLICIES))


def test_shadow_policy_per_call_option_and_report(limiter: Limiter, redis: RedisServer) -> None:
    first = limiter.check("u1", "new")
    assert first.allowed and not first.shadow_denied
    for _ in range(2):
        d = limiter.check("u1", "new")
        assert d.allowed and d.shadow_denied and d.retry_after is None and d.remaining == 0
        assert not LIMITED & {k.lower() for k in d.headers()}
        assert d.to_dict()["shadow_denied"] is True
    assert limiter.check("u2", "old").allowed
    enforced = limiter.check("u2", "old")
    assert not enforced.allowed and not enforced.shadow_denied
    d = limiter.check_shadow("u2", "old")
    assert d.allowed and d.shadow_denied
    d = asyncio.run(limiter.acheck_shadow("u2", "old"))
    assert d.allowed and d.shadow_denied
    report = limiter.shadow_report("new")
    assert report == {"policy": "new", "total": 2, "untracked": 0,
                      "keys": [{"key": "u1", "count": 2}]}
    report = asyncio.run(limiter.ashadow_report("old", top=1))
    assert report["total"] == 2 and report["keys"] == [{"key": "u2", "count": 2}]
    # another limiter (another process) reads the same counts from Redis
    again = Limiter.from_json(config([redis], POLICIES))
    assert again.shadow_report("new")["total"] == 2
    metrics = {p["policy"]: p for p in limiter.metrics_snapshot()["policies"]}
    assert metrics["new"]["shadow_denied"] == 2
    assert 'shardlimit_shadow_denied_total{policy="new"} 2' in limiter.metrics()
    with pytest.raises(shardlimit.InvalidArgumentError, match="policy"):
        limiter.shadow_report("a:b")


def test_events_shadow_denied_and_near_limit(limiter: Limiter) -> None:
    seen: list[dict[str, str]] = []
    got = threading.Condition()

    def on_event(e: dict[str, str]) -> None:
        with got:
            seen.append(e)
            got.notify_all()

    limiter.subscribe(on_event)
    limiter.check("k", "new")
    limiter.check("k", "new")  # shadow-denied
    for _ in range(6):
        limiter.check("p", "plan")  # crosses 5 of 10 once
    deadline = time.monotonic() + 10
    with got:
        while len(seen) < 3 and time.monotonic() < deadline:
            got.wait(0.1)
    # "new" (limit 1) crosses its default near_limit of 0.8 on its first check
    kinds = [(e["kind"], e["policy"]) for e in seen]
    assert kinds == [("near_limit", "new"), ("shadow_denied", "new"), ("near_limit", "plan")], seen
    assert seen[1]["key"] == "k" and seen[1]["limit"] == "1" and seen[1]["remaining"] == "0"
    assert (seen[2]["key"], seen[2]["limit"], seen[2]["remaining"]) == ("p", "10", "5")
    metrics = {p["policy"]: p for p in limiter.metrics_snapshot()["policies"]}
    assert metrics["plan"]["near_limit"] == 1


def test_concurrency_policies_cannot_be_shadowed() -> None:
    lim = Limiter.memory()
    with pytest.raises(shardlimit.InvalidArgumentError):
        lim.check_shadow("k", shardlimit.Policy("c", shardlimit.Limit.concurrency(1, 1.0)))


# ---------------------------------------------------------------- middlewares

def shadow_rule(request: Request) -> Any:
    return ("client", "new")


def assert_goes_through(responses: list[Any]) -> None:
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert responses[0].headers["x-ratelimit-remaining"] == "0"
    for r in responses[1:]:
        names = {k.lower() for k in r.headers.keys()}
        assert not LIMITED & names, dict(r.headers)
        assert r.headers["x-ratelimit-limit"] == "1"


def asgi_calls(app: Any, n: int = 3) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return [await c.get("/") for _ in range(n)]

    return asyncio.run(main())


def test_starlette_middleware_lets_shadow_denials_through(limiter: Limiter) -> None:
    async def hello(request: StarletteRequest) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter, rule=shadow_rule)
    assert_goes_through(asgi_calls(app))
    assert limiter.shadow_report("new")["total"] == 2


def test_fastapi_middleware_and_route_limits_let_shadow_denials_through(limiter: Limiter) -> None:
    app = FastAPI()

    @app.get("/")
    async def root() -> str:
        return "hello"

    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter, rule=shadow_rule)
    assert_goes_through(asgi_calls(app))
    # route limits: a decorator naming the shadow policy
    limits = asgi.RouteLimits(limiter)
    routed = FastAPI()

    @routed.get("/")
    @limits.limit("new", key=lambda r: "routed")
    async def limited() -> str:
        return "hello"

    routed.add_middleware(asgi.RateLimitMiddleware, limiter=limiter, routes=limits)
    assert_goes_through(asgi_calls(routed))
    assert limiter.shadow_report("new")["total"] == 4


def test_flask_wsgi_middleware_lets_shadow_denials_through(limiter: Limiter) -> None:
    app = Flask("shardlimit-shadow")

    @app.get("/")
    def hello() -> str:
        return "hello"

    app.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter, rule=shadow_rule
    )
    client = app.test_client()
    assert_goes_through([client.get("/") for _ in range(3)])
    assert limiter.shadow_report("new")["total"] == 2


def test_flask_route_limits_let_shadow_denials_through(limiter: Limiter) -> None:
    from shardlimit.flask import FlaskLimits

    app = Flask("shardlimit-shadow-routes")
    limits = FlaskLimits(limiter)

    @app.get("/")
    @limits.limit("new", key=lambda r: "flask-routed")
    def hello() -> str:
        return "hello"

    limits.init_app(app)
    client = app.test_client()
    assert_goes_through([client.get("/") for _ in range(3)])
    report = limiter.shadow_report("new")
    # (route limits scope the key by endpoint)
    assert report["total"] == 2 and len(report["keys"]) == 1
    assert report["keys"][0]["key"].endswith("flask-routed") and report["keys"][0]["count"] == 2
