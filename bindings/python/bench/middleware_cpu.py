"""The middlewares' own CPU per request, in process: an in-memory limiter (no Redis, no I/O
thread), a trivial ASGI app and a trivial WSGI app called directly, process time per
request with the middleware (``policy=``, every request admitted) minus without. What the
binding's Python and pyo3 code cost, apart from the network and the I/O thread:

    taskset -c 0 python bench/middleware_cpu.py [N]      # one JSON line, µs per request
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterable, MutableMapping
from typing import Any

import shardlimit
from shardlimit.asgi import RateLimitMiddleware as AsgiMiddleware
from shardlimit.wsgi import RateLimitMiddleware as WsgiMiddleware

POLICY = "1000000000/hour"
WARM = 2000
Message = MutableMapping[str, Any]


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def receive() -> Message:
    return {"type": "http.request", "body": b""}


async def send(message: Message) -> None:
    pass


def scope(i: int) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": "/", "root_path": "",
            "client": (f"10.0.{i % 4}.{i % 250}", 5000),
            "headers": [(b"host", b"t"), (b"user-agent", b"wrk"), (b"accept", b"*/*")]}


async def per_request_asgi(a: Any, n: int) -> float:
    for i in range(WARM):
        await a(scope(i), receive, send)
    t = time.process_time()
    for i in range(n):
        await a(scope(i), receive, send)
    return (time.process_time() - t) / n * 1e6


def wsgi_app(environ: Any, start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
    return None


def environ(i: int) -> dict[str, Any]:
    return {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": f"10.0.{i % 4}.{i % 250}",
            "HTTP_HOST": "t", "HTTP_USER_AGENT": "wrk", "HTTP_ACCEPT": "*/*",
            "SERVER_NAME": "t", "SERVER_PORT": "80", "wsgi.url_scheme": "http"}


def per_request_wsgi(a: Any, n: int) -> float:
    for i in range(WARM):
        a(environ(i), start_response)
    t = time.process_time()
    for i in range(n):
        a(environ(i), start_response)
    return (time.process_time() - t) / n * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    limiter = shardlimit.Limiter.memory()
    base_asgi = asyncio.run(per_request_asgi(app, n))
    asgi = asyncio.run(per_request_asgi(AsgiMiddleware(app, limiter, policy=POLICY, warm_up=0), n))
    base_wsgi = per_request_wsgi(wsgi_app, n)
    wsgi = per_request_wsgi(WsgiMiddleware(wsgi_app, limiter, policy=POLICY, warm_up=0), n)
    print(json.dumps({"asgi_added_us": round(asgi - base_asgi, 2),
                      "wsgi_added_us": round(wsgi - base_wsgi, 2), "n": n}))


if __name__ == "__main__":
    main()
