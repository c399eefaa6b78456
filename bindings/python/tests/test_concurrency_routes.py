"""Concurrency policies in the middlewares and route decorators: a request
acquires a lease and releases it when its response ends, also when the handler raises or
the client goes away; with rate limits beside it, those are checked together and a lease
is released when they deny. Against a real Redis, whose lease count is zero after each
test."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Callable

import httpx
import pytest
from flask import Flask
from redis_support import RedisServer, config
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from werkzeug.test import EnvironBuilder

from shardlimit import Limiter, _http, wsgi
from shardlimit.asgi import RateLimitMiddleware, RouteLimits
from shardlimit.flask import FlaskLimits

POLICIES = {
    "uploads": {"algorithm": "concurrency", "max": 2, "lease_ttl": "30s"},
    "hourly": {"algorithm": "fixed_window", "limit": 1, "window": "1h"},
}


def held(redis: RedisServer) -> int:
    """Units held by leases in Redis, over every concurrency key (the core's own count)."""
    lim = Limiter.from_json(config([redis], POLICIES))
    total = 0
    for name in redis.command("KEYS", "*:cc:*"):
        name = name.decode() if isinstance(name, bytes) else name
        # sl:s:uploads:cc:{KEY} (a key without braces is its own hash tag)
        total += 2 - lim.peek(name.split("{", 1)[1][:-1], "uploads").remaining
    return total


@pytest.fixture
def limiter(redis: RedisServer) -> Iterator[Limiter]:
    yield Limiter.from_json(config([redis], POLICIES))
    assert held(redis) == 0, "a lease was left held"


def starlette_app(limiter: Limiter, gate: asyncio.Event, entered: list[str]) -> Starlette:
    limits = RouteLimits(limiter)

    @limits.limit("uploads")
    async def upload(request: StarletteRequest) -> PlainTextResponse:
        entered.append("upload")
        await gate.wait()
        return PlainTextResponse("done")

    @limits.limit("uploads")
    async def boom(request: StarletteRequest) -> PlainTextResponse:
        raise RuntimeError("handler failed")

    @limits.limit("uploads")
    @limits.limit("hourly")
    async def both(request: StarletteRequest) -> PlainTextResponse:
        return PlainTextResponse("both")

    app = Starlette(routes=[Route("/upload", upload), Route("/boom", boom),
                            Route("/both", both)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, routes=limits)
    return app


async def until(cond: Callable[[], bool]) -> None:
    """Yields to the loop until ``cond`` holds (bounded: 5 s)."""
    deadline = asyncio.get_running_loop().time() + 5
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0)


def test_asgi_two_in_flight_then_429_then_admitted(limiter: Limiter, redis: RedisServer) -> None:
    async def main() -> list[int]:
        gate, entered = asyncio.Event(), list[str]()
        app = starlette_app(limiter, gate, entered)
        transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            slow = [asyncio.create_task(c.get("/upload")) for _ in range(2)]
            await until(lambda: len(entered) == 2)
            assert held(redis) == 2
            third = await c.get("/upload")
            gate.set()
            done = [(await t).status_code for t in slow]
            assert held(redis) == 0
            fourth = await c.get("/upload")
        return [*done, third.status_code, fourth.status_code]

    assert asyncio.run(main()) == [200, 200, 429, 200]


def test_asgi_an_exception_in_the_handler_releases(limiter: Limiter, redis: RedisServer) -> None:
    async def main() -> list[int]:
        app = starlette_app(limiter, asyncio.Event(), [])
        transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 4000),
                                        raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            # more than max: each raising request gave its lease back
            return [(await c.get("/boom")).status_code for _ in range(4)]

    assert asyncio.run(main()) == [500, 500, 500, 500]


def test_asgi_a_client_disconnect_releases(limiter: Limiter, redis: RedisServer) -> None:
    async def main() -> None:
        gate, entered = asyncio.Event(), list[str]()
        app = starlette_app(limiter, gate, entered)
        transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            for n in range(3):  # more than max
                task = asyncio.create_task(c.get("/upload"))
                await until(lambda: len(entered) == n + 1)
                assert held(redis) == 1
                task.cancel()  # the client went away: the request's task is cancelled
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.gather(*_http._RELEASING)
                assert held(redis) == 0

    asyncio.run(main())


def test_asgi_a_rate_denial_releases_the_lease(limiter: Limiter, redis: RedisServer) -> None:
    async def main() -> list[int]:
        app = starlette_app(limiter, asyncio.Event(), [])
        transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            out = []
            for _ in range(3):
                r = await c.get("/both")
                out.append(r.status_code)
                assert held(redis) == 0
            assert r.json()["policy"] == "hourly"  # the 429 is the rate limit's
            return out

    assert asyncio.run(main()) == [200, 429, 429]


def environ(path: str = "/") -> dict[str, Any]:
    env: dict[str, Any] = EnvironBuilder(path=path, environ_base={"REMOTE_ADDR": "10.0.0.1"}
                                         ).get_environ()
    return env


def call(app: Any, path: str = "/") -> tuple[str, Iterable[bytes]]:
    status: list[str] = []

    def start_response(s: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        status.append(s)
        return lambda b: None

    body = app(environ(path), start_response)
    return status[0], body


def test_wsgi_leases_go_back_when_the_response_is_closed(limiter: Limiter,
                                                         redis: RedisServer) -> None:
    class Body:
        closed = 0

        def __iter__(self) -> Iterator[bytes]:
            yield b"ok"

        def close(self) -> None:
            Body.closed += 1

    def app(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if env["PATH_INFO"] == "/boom":
            raise RuntimeError("handler failed")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Body()

    mw = wsgi.RateLimitMiddleware(app, limiter, rule=lambda r: ("k", "uploads"))
    (s1, b1), (s2, b2) = call(mw), call(mw)  # two responses not yet finished
    assert (s1, s2) == ("200 OK", "200 OK") and held(redis) == 2
    s3, b3 = call(mw)
    assert s3.startswith("429")
    assert b"".join(b1) == b"ok"
    b1.close()  # type: ignore[attr-defined]
    b1.close()  # type: ignore[attr-defined]  # twice: released once
    assert Body.closed == 2 and held(redis) == 1
    s4, b4 = call(mw)
    assert s4 == "200 OK" and held(redis) == 2
    for b in (b2, b4):
        b.close()  # type: ignore[attr-defined]
    assert held(redis) == 0
    for _ in range(3):  # an app that raises gives the lease back
        with pytest.raises(RuntimeError):
            call(mw, "/boom")
    assert held(redis) == 0


def test_flask_teardown_releases(limiter: Limiter, redis: RedisServer) -> None:
    app = Flask(__name__)
    limits = FlaskLimits(limiter, app)
    gate, entered = threading.Event(), threading.Semaphore(0)

    @app.get("/upload")
    @limits.limit("uploads")
    def upload() -> str:
        entered.release()
        assert gate.wait(5)
        return "done"

    @app.get("/boom")
    @limits.limit("uploads")
    def boom() -> str:
        raise RuntimeError("handler failed")

    @app.get("/both")
    @limits.limit("uploads")
    @limits.limit("hourly")
    def both() -> str:
        return "both"

    statuses: list[int] = []

    def get() -> None:
        statuses.append(app.test_client().get("/upload").status_code)

    slow = [threading.Thread(target=get) for _ in range(2)]
    for t in slow:
        t.start()
    assert entered.acquire(timeout=5) and entered.acquire(timeout=5)
    assert held(redis) == 2
    assert app.test_client().get("/upload").status_code == 429
    gate.set()
    for t in slow:
        t.join(5)
    assert statuses == [200, 200] and held(redis) == 0
    assert app.test_client().get("/upload").status_code == 200
    assert [app.test_client().get("/boom").status_code for _ in range(3)] == [500] * 3
    assert held(redis) == 0
    assert [app.test_client().get("/both").status_code for _ in range(3)] == [200, 429, 429]
