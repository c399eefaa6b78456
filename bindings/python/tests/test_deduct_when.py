"""Counting only failed (or only successful) requests through the middlewares: each
request reserves its units atomically and gets them back when its response does not count
(Flask-Limiter's ``deduct_when``), in Flask and in ASGI (Starlette, FastAPI)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import httpx
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse as FastText
from flask import Flask
from redis_support import RedisServer, config
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from shardlimit import Limiter, asgi
from shardlimit.flask import FlaskLimits

POLICIES = {"login": {"algorithm": "fixed_window", "limit": 3, "window": "1h"}}


def limiter(redis: RedisServer) -> Limiter:
    return Limiter.from_json(config([redis], POLICIES))


def test_flask_counts_only_failed_logins(redis: RedisServer) -> None:
    lim = limiter(redis)
    app = Flask(__name__)
    FlaskLimits(lim, app, policy="login", deduct_when=lambda r: r.status_code >= 400, warm_up=0)

    @app.post("/login")
    def login() -> tuple[str, int]:
        from flask import request

        return ("ok", 200) if request.args.get("pw") == "right" else ("no", 401)

    c = app.test_client()
    # successes never count: ten of them leave the budget whole
    for _ in range(10):
        assert c.post("/login?pw=right").status_code == 200
    assert lim.peek("ip:127.0.0.1", "login").remaining == 3
    # three failures use it up; the fourth attempt is limited, right password or not
    for _ in range(3):
        assert c.post("/login?pw=wrong").status_code == 401
    assert c.post("/login?pw=right").status_code == 429
    assert lim.peek("ip:127.0.0.1", "login").remaining == 0


def asgi_app(kind: str, lim: Limiter, deduct_when: Callable[[int], bool]) -> Any:
    if kind == "fastapi":
        fast = FastAPI()

        @fast.get("/")
        async def root(ok: int = 1) -> FastText:
            return FastText("x", status_code=200 if ok else 500)

        fast.add_middleware(asgi.RateLimitMiddleware, limiter=lim, policy="login",
                            deduct_when=deduct_when, warm_up=0)
        return fast

    async def root_s(request: StarletteRequest) -> PlainTextResponse:
        ok = request.query_params.get("ok", "1") == "1"
        return PlainTextResponse("x", status_code=200 if ok else 500)

    app = Starlette(routes=[Route("/", root_s)])
    app.add_middleware(asgi.RateLimitMiddleware, limiter=lim, policy="login",
                       deduct_when=deduct_when, warm_up=0)
    return app


def test_asgi_counts_only_what_deduct_when_accepts(redis: RedisServer) -> None:
    for kind in ("starlette", "fastapi"):
        redis.command("FLUSHALL")
        lim = limiter(redis)
        # count successes only (express-rate-limit's skipFailedRequests)
        app = asgi_app(kind, lim, lambda status: status < 400)

        async def main() -> list[int]:
            transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 4000))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                codes = [(await c.get("/?ok=0")).status_code for _ in range(5)]
                codes += [(await c.get("/?ok=1")).status_code for _ in range(4)]
                return codes

        codes = asyncio.run(main())
        assert codes == [500] * 5 + [200, 200, 200, 429], (kind, codes)
        assert lim.peek("ip:10.0.0.9", "login").remaining == 0
