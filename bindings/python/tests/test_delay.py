"""A leaky bucket admits a request for later (``decision.delay``): every middleware holds
the request until then before the app runs, as Node's and tower's do."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from flask import Flask
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from shardlimit import Limiter, asgi, wsgi
from shardlimit._http import Request, Target

# one request a second: the first is served at once, one sent right after it waits for its
# slot (about a second)
POLICIES = {"shaped": {"algorithm": "leaky_bucket", "capacity": 3, "leak_per_sec": 1}}


def rule(request: Request) -> Target:
    return ("k", "shaped")


def test_asgi_holds_the_delay() -> None:
    limiter = Limiter.from_json(json.dumps({"policies": POLICIES}))
    served: list[float] = []

    async def hello(request: StarletteRequest) -> PlainTextResponse:
        served.append(time.monotonic())
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter, rule=rule)

    async def main() -> list[tuple[float, httpx.Response]]:
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
        out = []
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            for _ in range(2):
                sent = time.monotonic()
                out.append((sent, await c.get("/")))
        return out

    (sent0, r0), (sent1, r1) = asyncio.run(main())
    assert (r0.status_code, r1.status_code) == (200, 200)
    assert served[0] >= sent0
    # the second waits for its slot (about a second after the first)
    assert served[1] - sent1 >= 0.5, served[1] - sent1


def test_wsgi_holds_the_delay() -> None:
    limiter = Limiter.from_json(json.dumps({"policies": POLICIES}))
    served: list[float] = []
    app = Flask(__name__)

    @app.route("/")
    def hello() -> str:
        served.append(time.monotonic())
        return "hello"

    app.wsgi_app = wsgi.RateLimitMiddleware(app.wsgi_app, limiter, rule=rule)  # type: ignore[method-assign]
    client = app.test_client()
    sent0 = time.monotonic()
    assert client.get("/").status_code == 200
    sent1 = time.monotonic()
    assert client.get("/").status_code == 200
    assert served[0] >= sent0
    assert served[1] - sent1 >= 0.5, served[1] - sent1
