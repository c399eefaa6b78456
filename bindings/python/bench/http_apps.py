"""Trivial routes for scripts/bench-peers.sh, with one limiter in front of each:

    BENCH_MODE=none|shardlimit|peer|headers BENCH_REDIS=redis://127.0.0.1:PORT [BENCH_TRANSPORT=host] \\
        uvicorn --app-dir bench http_apps:fastapi_app      (FastAPI; peer: slowapi)
        gunicorn --chdir bench http_apps:flask_app          (Flask; peer: Flask-Limiter)

Every limiter keys by client address, a fixed window of 10^9 per hour (never denied), on
Redis; shardlimit through its own ASGI / WSGI middleware. `headers` checks nothing and adds
the five rate-limit headers of an admission (fixed values) to every response, as a plain
middleware: what the headers alone cost the server, apart from the check.
"""

from __future__ import annotations

import json
import os
from typing import Any, cast

MODE = os.environ.get("BENCH_MODE", "none")
REDIS = os.environ.get("BENCH_REDIS", "")
#: shardlimit's transport: "host" moves acheck's bytes on the asyncio loop (FastAPI)
TRANSPORT = os.environ.get("BENCH_TRANSPORT", "default")
#: the config's spin_wait when set (e.g. "0"): unset, the core's default for this process
SPIN_WAIT = os.environ.get("BENCH_SPIN_WAIT")
LIMIT = 10**9
if MODE not in ("none", "shardlimit", "peer", "headers"):
    raise SystemExit(f"BENCH_MODE must be none, shardlimit, peer or headers, got {MODE}")
#: an admission's headers as the middlewares add them (headers="both"), fixed values
HEADERS = [("X-RateLimit-Limit", "1000000000"), ("X-RateLimit-Remaining", "999999000"),
           ("X-RateLimit-Reset", "1764806400"), ("RateLimit-Policy", "1000000000;w=3600"),
           ("RateLimit", "limit=1000000000, remaining=999999000, reset=2400")]
RAW_HEADERS = [(k.lower().encode(), v.encode()) for k, v in HEADERS]


def _limiter() -> Any:
    import shardlimit

    config: dict[str, Any] = {
        "shards": [{"name": "bench", "url": REDIS}],
        "timeout_ms": 1000,
        # on_error closed: a fallback answers 503, which fails the run (only decisions
        # that came from Redis are measured; scripts/bench-peers.sh counts non-2xx)
        "policies": {"api": {"algorithm": "fixed_window", "limit": LIMIT, "window": "1h",
                             "on_error": "closed"}},
    }
    if SPIN_WAIT is not None:
        config["spin_wait"] = SPIN_WAIT
    return shardlimit.Limiter.from_json(json.dumps(config), transport=cast(Any, TRANSPORT))


def _fastapi() -> Any:
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app = FastAPI()
    if MODE == "peer":
        from slowapi import Limiter, _rate_limit_exceeded_handler
        from slowapi.errors import RateLimitExceeded
        from slowapi.middleware import SlowAPIMiddleware
        from slowapi.util import get_remote_address

        limiter = Limiter(key_func=get_remote_address, storage_uri=REDIS,
                          default_limits=[f"{LIMIT}/hour"], strategy="fixed-window")
        app.state.limiter = limiter
        app.add_exception_handler(RateLimitExceeded, cast(Any, _rate_limit_exceeded_handler))
        app.add_middleware(SlowAPIMiddleware)

    @app.get("/", response_class=PlainTextResponse)
    async def root() -> str:
        return "ok"

    if MODE == "shardlimit":
        from shardlimit.asgi import RateLimitMiddleware

        return RateLimitMiddleware(app, _limiter(), policy="api")
    if MODE == "headers":
        async def with_headers(scope: Any, receive: Any, send: Any) -> None:
            async def send_with(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message = dict(message)
                    message["headers"] = list(message.get("headers") or ()) + RAW_HEADERS
                await send(message)

            await app(scope, receive, send_with if scope["type"] == "http" else send)

        return with_headers
    return app


def _flask() -> Any:
    from flask import Flask

    app = Flask(__name__)

    @app.get("/")
    def root() -> str:
        return "ok"

    if MODE == "peer":
        from flask_limiter import Limiter
        from flask_limiter.util import get_remote_address

        Limiter(get_remote_address, app=app, storage_uri=REDIS,
                default_limits=[f"{LIMIT}/hour"], strategy="fixed-window")
    if MODE == "shardlimit":
        from shardlimit.wsgi import RateLimitMiddleware

        app.wsgi_app = RateLimitMiddleware(app.wsgi_app, _limiter(), policy="api")  # type: ignore[method-assign]
    if MODE == "headers":
        inner = app.wsgi_app

        def with_headers(environ: Any, start_response: Any) -> Any:
            def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                return start_response(status, list(headers) + HEADERS, exc_info)

            return inner(environ, start)

        app.wsgi_app = with_headers  # type: ignore[method-assign]
    return app


def __getattr__(name: str) -> Any:
    # built on first use: a FastAPI server imports no Flask, and the reverse
    if name == "fastapi_app":
        return _fastapi()
    if name == "flask_app":
        return _flask()
    raise AttributeError(name)
