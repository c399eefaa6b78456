"""The middlewares end to end: a real Starlette app over ASGI (httpx) and a real Flask app
(its test client), both limited by a real Redis."""

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
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import shardlimit
from shardlimit import Limit, Limiter, asgi, wsgi
from shardlimit._http import Request, Target

POLICIES = {
    "api": {"algorithm": "fixed_window", "limit": 2, "window": "1h"},
    "expensive": {"algorithm": "sliding_log", "limit": 5, "window": "1h"},
}
RATE_HEADERS = {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
                "ratelimit-policy", "ratelimit"}


@pytest.fixture
def limiter(redis: RedisServer) -> Limiter:
    return Limiter.from_json(config([redis], POLICIES))


def rule(request: Request) -> Optional[Target]:
    """Health checks are free, /report costs 3 units of "expensive", the rest is "api" per
    API key (or per client address without one)."""
    if request.path == "/health":
        return None
    who = request.headers.get("x-api-key") or f"ip:{request.client_ip}"
    if request.path == "/report":
        return (who, "expensive", 3)
    return (who, "api")


# ---------------------------------------------------------------- ASGI (Starlette)

def starlette_app(limiter: Limiter, **kw: object) -> Starlette:
    async def hello(request: StarletteRequest) -> PlainTextResponse:
        return PlainTextResponse("hello")

    async def report(request: StarletteRequest) -> JSONResponse:
        return JSONResponse({"report": True}, headers={"x-app": "kept"})

    app = Starlette(routes=[Route("/", hello), Route("/health", hello),
                            Route("/report", report)])
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter, **kw)  # type: ignore[arg-type]
    return app


async def asgi_get(app: Starlette, path: str, client: str = "10.1.2.3",
                   **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=(client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        return await c.get(path, headers=headers)


def test_asgi_headers_then_429(limiter: Limiter) -> None:
    app = starlette_app(limiter, rule=rule)

    async def main() -> list[httpx.Response]:
        return [await asgi_get(app, "/", **{"x-api-key": "key-1"}) for _ in range(3)]

    ok1, ok2, denied = asyncio.run(main())
    assert (ok1.status_code, ok1.text) == (200, "hello")
    assert RATE_HEADERS <= set(ok1.headers)
    assert ok1.headers["x-ratelimit-limit"] == "2"
    assert [ok1.headers["x-ratelimit-remaining"], ok2.headers["x-ratelimit-remaining"]] == ["1", "0"]
    assert ok1.headers["ratelimit-policy"] == '"api";q=2;w=3600'
    assert denied.status_code == 429
    assert denied.headers["content-type"] == "application/json"
    assert 0 < int(denied.headers["retry-after"]) <= 3600
    body = denied.json()
    assert body["error"] == "rate_limited" and body["policy"] == "api"
    assert body["retry_after"] == int(denied.headers["retry-after"])
    assert denied.headers["x-ratelimit-remaining"] == "0"


def test_asgi_rule_keys_costs_and_bypass(limiter: Limiter) -> None:
    app = starlette_app(limiter, rule=rule)

    async def main() -> None:
        # 3 units of 5 each: the second report is denied, and consumed nothing
        r1 = await asgi_get(app, "/report", **{"x-api-key": "k"})
        assert r1.status_code == 200 and r1.headers["x-app"] == "kept"
        assert r1.headers["x-ratelimit-remaining"] == "2"
        r2 = await asgi_get(app, "/report", **{"x-api-key": "k"})
        assert r2.status_code == 429 and r2.headers["x-ratelimit-remaining"] == "2"
        # separate budgets per client address; /health is never limited
        for _ in range(2):
            assert (await asgi_get(app, "/", client="10.0.0.1")).status_code == 200
        assert (await asgi_get(app, "/", client="10.0.0.1")).status_code == 429
        assert (await asgi_get(app, "/", client="10.0.0.2")).status_code == 200
        for _ in range(5):
            h = await asgi_get(app, "/health", client="10.0.0.1")
            assert h.status_code == 200 and "x-ratelimit-limit" not in h.headers

    asyncio.run(main())


def test_asgi_by_client_ip_with_a_limit(limiter: Limiter) -> None:
    app = starlette_app(limiter, policy=Limit.fixed_window(1, 3600))

    async def main() -> list[int]:
        return [(await asgi_get(app, "/", client=ip)).status_code
                for ip in ("10.9.9.9", "10.9.9.9", "10.9.9.8")]

    assert asyncio.run(main()) == [200, 429, 200]


def test_asgi_by_client_ip_keys_ipv6_by_network(limiter: Limiter) -> None:
    app = starlette_app(limiter, policy=Limit.fixed_window(2, 3600))

    async def main() -> list[int]:
        return [(await asgi_get(app, "/", client=ip)).status_code
                for ip in ("2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff::3",
                           "2001:db8:1:3::1")]

    # one client rotating through its /64 is one budget; the next /64 is another client
    assert asyncio.run(main()) == [200, 200, 429, 200]


def test_by_client_ip_rejects_a_bad_prefix() -> None:
    with pytest.raises(shardlimit.InvalidArgumentError, match="ipv6_prefix"):
        asgi.by_client_ip("api", ipv6_prefix=0)


def test_asgi_passes_non_http_scopes(limiter: Limiter) -> None:
    seen: list[str] = []

    async def app(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        seen.append(scope["type"])

    mw = asgi.RateLimitMiddleware(app, limiter, policy="api")

    async def receive() -> asgi.Message:
        return {"type": "lifespan.startup"}

    async def send(message: asgi.Message) -> None:
        pass

    asyncio.run(mw({"type": "lifespan"}, receive, send))
    assert seen == ["lifespan"]


def test_middleware_arguments(limiter: Limiter) -> None:
    with pytest.raises(TypeError):
        asgi.RateLimitMiddleware(starlette_app(limiter, policy="api"), limiter)
    with pytest.raises(TypeError):
        wsgi.RateLimitMiddleware(Flask("x").wsgi_app, limiter, rule, policy="api")


# ---------------------------------------------------------------- WSGI (Flask)

def flask_app(limiter: Limiter, **kw: object) -> Flask:
    app = Flask("shardlimit-test")

    @app.get("/")
    def hello() -> str:
        return "hello"

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.get("/report")
    def report() -> tuple[dict[str, bool], int, dict[str, str]]:
        return {"report": True}, 200, {"X-App": "kept"}

    app.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter, **kw  # type: ignore[arg-type]
    )
    return app


def test_wsgi_headers_then_429(limiter: Limiter) -> None:
    client = flask_app(limiter, rule=rule).test_client()
    ok1 = client.get("/", headers={"X-Api-Key": "key-1"})
    ok2 = client.get("/", headers={"X-Api-Key": "key-1"})
    denied = client.get("/", headers={"X-Api-Key": "key-1"})
    assert (ok1.status_code, ok1.text) == (200, "hello")
    assert RATE_HEADERS <= {k.lower() for k in ok1.headers.keys()}
    assert [ok1.headers["X-RateLimit-Remaining"], ok2.headers["X-RateLimit-Remaining"]] == ["1", "0"]
    assert denied.status_code == 429 and denied.content_type == "application/json"
    body = json.loads(denied.data)
    assert body["error"] == "rate_limited" and body["policy"] == "api"
    assert body["retry_after"] == int(denied.headers["Retry-After"]) > 0


def test_wsgi_rule_keys_costs_and_bypass(limiter: Limiter) -> None:
    client = flask_app(limiter, rule=rule).test_client()
    r1 = client.get("/report", headers={"X-Api-Key": "k"})
    assert r1.status_code == 200 and r1.headers["X-App"] == "kept"
    assert r1.headers["X-RateLimit-Remaining"] == "2"
    assert client.get("/report", headers={"X-Api-Key": "k"}).status_code == 429

    def from_ip(ip: str) -> int:
        return client.get("/", environ_base={"REMOTE_ADDR": ip}).status_code

    assert [from_ip("10.0.0.1") for _ in range(3)] + [from_ip("10.0.0.2")] == [200, 200, 429, 200]
    for _ in range(5):
        h = client.get("/health", environ_base={"REMOTE_ADDR": "10.0.0.1"})
        assert h.status_code == 200 and "X-RateLimit-Limit" not in h.headers


def test_wsgi_by_client_ip(limiter: Limiter) -> None:
    client = flask_app(limiter, policy="api").test_client()
    codes = [client.get("/", environ_base={"REMOTE_ADDR": "10.7.7.7"}).status_code
             for _ in range(3)]
    assert codes == [200, 200, 429]


def test_a_local_fallback_denial_is_a_429_with_its_own_headers() -> None:
    """``on_error: local`` decides with this process's share of the limit: a real decision,
    so its denial is a 429 with its own Retry-After and budget headers, not a 503."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    limiter = Limiter.from_json(json.dumps({
        "timeout_ms": 200, "on_error": "local", "instances": 1,
        "shards": [{"name": "s0", "url": f"redis://127.0.0.1:{port}"}],
        "policies": {"api": {"algorithm": "fixed_window", "limit": 2, "window": "1h"}},
    }))
    app = starlette_app(limiter, rule=lambda r: ("k", "api"))

    async def main() -> list[httpx.Response]:
        return [await asgi_get(app, "/") for _ in range(3)]

    ok1, ok2, denied = asyncio.run(main())
    assert [ok1.status_code, ok2.status_code] == [200, 200]
    assert [ok1.headers["x-ratelimit-remaining"], ok2.headers["x-ratelimit-remaining"]] == ["1", "0"]
    assert denied.status_code == 429, denied.text
    assert 1 <= int(denied.headers["retry-after"]) <= 3600
    assert denied.headers["x-ratelimit-remaining"] == "0"
    assert "x-ratelimit-status" not in denied.headers
    assert denied.json()["error"] == "rate_limited"
    assert limiter.check("k", "api").source == "local_fallback"
