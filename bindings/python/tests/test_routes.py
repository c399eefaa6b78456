"""Route-level limits (decorators) for FastAPI/Starlette and Flask against a real Redis:
sub-app mounting, routers, exempt, shared limits, per-route cost, plans, custom handlers,
header options, one header set, and the answers to an outage (503, exception handlers)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from fastapi import Request as FastAPIRequest
from fastapi.responses import JSONResponse, PlainTextResponse
from flask import Flask, g
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Limiter
from shardlimit.asgi import RateLimitMiddleware, RouteLimits
from shardlimit.flask import FlaskLimits


POLICIES = {
    "api": {"algorithm": "fixed_window", "limit": 100, "window": "1h"},
    "strict": {"algorithm": "fixed_window", "limit": 1, "window": "1h", "on_error": "closed"},
    "raising": {"algorithm": "fixed_window", "limit": 1, "window": "1h", "on_error": "error"},
}


@pytest.fixture
def limiter(redis: RedisServer) -> Limiter:
    return Limiter.from_json(config([redis], POLICIES, timeout_ms=200))


def key_header(request: shardlimit.asgi.Request) -> str | None:
    return request.headers.get("x-user")


def sub_app(limits: RouteLimits) -> FastAPI:
    """The routes, mounted under /v1 by main_app (the shape that used to skip the limit)."""
    sub = FastAPI()
    router = APIRouter(prefix="/auth")

    @router.post("/login")
    @limits.limit("3/minute")
    async def login() -> dict[str, str]:
        return {"ok": "login"}

    sub.include_router(router)

    @sub.get("/stacked")
    @limits.limit("2/minute")
    @limits.limit("5/hour")
    async def stacked() -> str:
        return "stacked"

    @sub.get("/a")
    @limits.shared_limit("3/minute", scope="reports")
    async def a() -> str:
        return "a"

    @sub.get("/b")
    @limits.shared_limit("3/minute", scope="reports", cost=2)
    async def b() -> str:
        return "b"

    @sub.get("/health")
    @limits.exempt
    async def health() -> str:
        return "ok"

    @sub.get("/plan")
    @limits.limit(lambda r: "1/minute" if r.headers.get("x-plan") == "free" else "3/minute",
                  key=key_header)
    async def plan() -> str:
        return "plan"

    @sub.get("/state")
    @limits.limit("10/minute")
    async def state(request: FastAPIRequest) -> dict[str, Any]:
        d = request.state.shardlimit
        return {"source": d.source, "remaining": d.remaining}

    @sub.get("/own-headers")
    @limits.limit("10/minute")
    async def own_headers() -> PlainTextResponse:
        return PlainTextResponse("x", status_code=429, headers={"X-RateLimit-Limit": "7"})

    @sub.get("/strict")
    @limits.limit("strict")
    async def strict() -> str:
        return "strict"

    @sub.get("/raising")
    @limits.limit("raising")
    async def raising() -> str:
        return "raising"

    return sub


def main_app(limiter: Limiter, **options: Any) -> FastAPI:
    limits = RouteLimits(limiter)
    app = FastAPI()
    app.mount("/v1", sub_app(limits))

    @app.exception_handler(shardlimit.BackendError)
    async def backend_down(request: FastAPIRequest, exc: shardlimit.BackendError) -> JSONResponse:
        return JSONResponse({"handled": type(exc).__name__}, status_code=502)

    app.add_middleware(RateLimitMiddleware, limiter=limiter, routes=limits, **options)
    return app


def run(app: FastAPI, *calls: tuple[str, str, dict[str, str]]) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return [await c.request(m, p, headers=h) for m, p, h in calls]

    return asyncio.run(main())


def codes(responses: list[httpx.Response]) -> list[int]:
    return [r.status_code for r in responses]


def test_mounted_router_route_is_limited_on_its_endpoint(limiter: Limiter) -> None:
    app = main_app(limiter)
    rs = run(app, *[("POST", "/v1/auth/login", {})] * 4)
    assert codes(rs) == [200, 200, 200, 429]
    assert rs[0].headers["x-ratelimit-limit"] == "3"
    assert rs[3].json()["error"] == "rate_limited"


def test_stacked_exempt_shared_and_cost(limiter: Limiter) -> None:
    app = main_app(limiter)
    assert codes(run(app, *[("GET", "/v1/stacked", {})] * 3)) == [200, 200, 429]
    # the hourly layer consumed only for the admitted two
    assert codes(run(app, *[("GET", "/v1/health", {})] * 10)) == [200] * 10
    # one budget of 3 for /a (cost 1) and /b (cost 2)
    assert codes(run(app, ("GET", "/v1/b", {}), ("GET", "/v1/a", {}), ("GET", "/v1/a", {}))) == \
        [200, 200, 429]


def test_a_callable_picks_the_plan_and_the_key(limiter: Limiter) -> None:
    app = main_app(limiter)
    free = {"x-plan": "free", "x-user": "u1"}
    pro = {"x-plan": "pro", "x-user": "u2"}
    assert codes(run(app, *[("GET", "/v1/plan", free)] * 2)) == [200, 429]
    assert codes(run(app, *[("GET", "/v1/plan", pro)] * 4)) == [200, 200, 200, 429]
    # no key: the limit is skipped for this request
    assert codes(run(app, *[("GET", "/v1/plan", {})] * 5)) == [200] * 5


def test_decision_reaches_the_handler_and_one_header_set(limiter: Limiter) -> None:
    app = main_app(limiter)
    (r,) = run(app, ("GET", "/v1/state", {}))
    assert r.json() == {"source": "redis", "remaining": 9}
    (own,) = run(app, ("GET", "/v1/own-headers", {}))
    assert own.status_code == 429
    assert own.headers.get_list("x-ratelimit-limit") == ["7"]
    assert "ratelimit" not in own.headers


def test_header_options(limiter: Limiter) -> None:
    before = int(time.time())
    (r,) = run(main_app(limiter, headers="x-ratelimit"), ("GET", "/v1/state", {}))
    assert "ratelimit" not in r.headers and "ratelimit-policy" not in r.headers
    reset = int(r.headers["x-ratelimit-reset"])
    # the window's end, rounded up to a whole second: at most 60 s after the second now ends
    assert before < reset <= math.ceil(time.time()) + 60, "a Unix timestamp"
    (r,) = run(main_app(limiter, headers="ietf"), ("GET", "/v1/state", {}))
    assert "x-ratelimit-limit" not in r.headers
    assert 0 < int(r.headers["ratelimit"].rsplit("t=", 1)[1]) <= 60, "IETF keeps delta seconds"
    app = main_app(limiter, retry_after="http-date")
    rs = run(app, *[("POST", "/v1/auth/login", {})] * 4)
    when = parsedate_to_datetime(rs[3].headers["retry-after"]).timestamp()
    assert time.time() - 2 < when <= time.time() + 61
    with pytest.raises(shardlimit.InvalidArgumentError, match="headers"):
        RateLimitMiddleware(main_app(limiter), limiter, routes=RouteLimits(limiter), headers="all")


def test_custom_handlers(limiter: Limiter) -> None:
    def limited(request: shardlimit.asgi.Request, d: shardlimit.Decision) -> PlainTextResponse:
        return PlainTextResponse(f"slow down, {d.policy}", status_code=429)

    app = main_app(limiter, on_limited=limited)
    rs = run(app, *[("POST", "/v1/auth/login", {})] * 4)
    assert rs[3].status_code == 429 and rs[3].text.startswith("slow down")
    assert rs[3].headers.get_list("x-ratelimit-remaining") == ["0"], "headers added once"


def test_unknown_policy_fails_when_the_decorator_is_built(limiter: Limiter) -> None:
    limits = RouteLimits(limiter)
    with pytest.raises(shardlimit.UnknownPolicyError):
        limits.limit("no-such-policy")
    with pytest.raises(shardlimit.InvalidArgumentError, match="fortnight"):
        limits.limit("5/fortnight")
    with pytest.raises(shardlimit.UnknownPolicyError):
        FlaskLimits(limiter, policy="no-such-policy")


@pytest.fixture
def stopped(redis: RedisServer) -> Iterator[RedisServer]:
    """The Redis process frozen (SIGSTOP): connections hang, every call times out."""
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        yield redis
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)


def test_outage_answers_503_and_reaches_exception_handlers(limiter: Limiter,
                                                           stopped: RedisServer) -> None:
    unavailable: list[str] = []

    def on_unavailable(request: shardlimit.asgi.Request, d: shardlimit.Decision) -> JSONResponse:
        unavailable.append(d.source)
        return JSONResponse({"down": True}, status_code=503, headers={"Retry-After": "30"})

    app = main_app(limiter, outage_retry_after=7)
    strict, raising = run(app, ("GET", "/v1/strict", {}), ("GET", "/v1/raising", {}))
    assert strict.status_code == 503, "a fallback that denies is not the client's fault"
    assert strict.headers["retry-after"] == "7"
    assert strict.json()["error"] == "rate_limit_unavailable"
    assert raising.status_code == 502 and raising.json() == {"handled": "TimeoutError"}
    (custom,) = run(main_app(limiter, on_unavailable=on_unavailable), ("GET", "/v1/strict", {}))
    assert (custom.status_code, custom.headers["retry-after"]) == (503, "30")
    assert unavailable == ["fallback"]


def test_outage_body_is_the_cores_with_its_error(limiter: Limiter, stopped: RedisServer) -> None:
    """The 503 body is the decision's own body (as tower, Node and Go answer) with only
    ``error`` changed: the same fields, the core's message, no field of its own."""
    seen: list[dict[str, Any]] = []

    def on_unavailable(request: shardlimit.asgi.Request, d: shardlimit.Decision) -> JSONResponse:
        seen.append(d.body())
        return JSONResponse({}, status_code=503)

    run(main_app(limiter, on_unavailable=on_unavailable), ("GET", "/v1/strict", {}))
    (strict,) = run(main_app(limiter, outage_retry_after=7), ("GET", "/v1/strict", {}))
    expected = {**seen[0], "error": "rate_limit_unavailable"}
    assert set(expected) == {"error", "policy", "limit", "remaining", "retry_after", "message"}
    assert strict.status_code == 503 and strict.json() == expected
    assert "could not be checked" in expected["message"]
    flask = flask_app(limiter, outage_retry_after=9, warm_up=0).test_client().get("/strict")
    assert flask.status_code == 503 and json.loads(flask.data) == expected


# ---------------------------------------------------------------- Flask

def flask_app(limiter: Limiter, **options: Any) -> Flask:
    from flask import Blueprint

    app = Flask("routes")
    limits = FlaskLimits(limiter, **options)
    bp = Blueprint("auth", __name__, url_prefix="/auth")

    @bp.post("/login")
    @limits.limit("3/minute")
    def login() -> str:
        return "login"

    app.register_blueprint(bp, url_prefix="/v1/auth")

    @app.get("/a")
    @limits.shared_limit("3/minute", scope="reports")
    def a() -> str:
        return "a"

    @app.get("/b")
    @limits.shared_limit("3/minute", scope="reports", cost=2)
    def b() -> str:
        return "b"

    @app.get("/health")
    @limits.exempt
    def health() -> str:
        return "ok"

    @app.get("/state")
    @limits.limit("10/minute")
    def state() -> dict[str, Any]:
        return {"source": g.shardlimit.source, "remaining": g.shardlimit.remaining}

    @app.get("/strict")
    @limits.limit("strict")
    def strict() -> str:
        return "strict"

    @app.get("/raising")
    @limits.limit("raising")
    def raising() -> str:
        return "raising"

    @app.errorhandler(shardlimit.BackendError)
    def backend_down(e: shardlimit.BackendError) -> tuple[dict[str, str], int]:
        return {"handled": type(e).__name__}, 502

    limits.init_app(app)
    return app


def test_flask_blueprint_exempt_shared_and_state(limiter: Limiter) -> None:
    c = flask_app(limiter).test_client()
    rs = [c.post("/v1/auth/login") for _ in range(4)]
    assert [r.status_code for r in rs] == [200, 200, 200, 429]
    assert json.loads(rs[3].data)["error"] == "rate_limited"
    assert [c.get("/health").status_code for _ in range(5)] == [200] * 5
    assert [c.get(p).status_code for p in ("/b", "/a", "/a")] == [200, 200, 429]
    r = c.get("/state")
    assert r.json == {"source": "redis", "remaining": 9}
    assert r.headers.getlist("X-RateLimit-Limit") == ["10"]
    assert int(r.headers["X-RateLimit-Reset"]) > time.time()


def test_flask_outage(limiter: Limiter, stopped: RedisServer) -> None:
    c = flask_app(limiter, outage_retry_after=9, warm_up=0).test_client()
    strict = c.get("/strict")
    assert (strict.status_code, strict.headers["Retry-After"]) == (503, "9")
    raising = c.get("/raising")
    assert raising.status_code == 502 and raising.json == {"handled": "TimeoutError"}


def lifespan_startup(app: Any) -> list[str]:
    """Runs the ASGI lifespan start-up of ``app``; returns the messages it sent."""
    sent: list[str] = []

    async def main() -> None:
        messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

        async def receive() -> dict[str, str]:
            return messages.pop(0)

        async def send(message: Any) -> None:
            sent.append(message["type"])

        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)

    asyncio.run(main())
    return sent


def test_lifespan_start_up_connects_before_traffic(redis: RedisServer) -> None:
    def client_ids() -> set[str]:
        lines = redis.command("CLIENT", "LIST").decode().strip().splitlines()
        return {line.split(" ", 1)[0] for line in lines}

    limiter = Limiter.from_json(config([redis], POLICIES))
    before = client_ids()
    sent = lifespan_startup(main_app(limiter))
    assert sent[0] == "lifespan.startup.complete"
    # compared by id, not counted: a connection of an earlier test's limiter may close meanwhile
    new = client_ids() - before
    # the pipe, and one pooled connection for blocking calls (Limiter.connect)
    assert new, "the limiter's connections are made at start-up"


def test_lifespan_warns_when_a_shard_does_not_answer(redis: RedisServer,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES, timeout_ms=50))
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        with caplog.at_level("WARNING", logger="shardlimit"):
            sent = lifespan_startup(main_app(limiter, warm_up=0.3))
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    assert sent[0] == "lifespan.startup.complete", "start-up goes on, with a warning"
    assert "warm-up incomplete" in caplog.text
