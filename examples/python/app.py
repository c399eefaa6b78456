"""A FastAPI service rate limited by shardlimit's ASGI middleware.

    pip install ./bindings/python -r examples/python/requirements.txt
    SHARDLIMIT_CONFIG=shard-config.json python examples/python/app.py --port 8000 --policy api

The config comes from $SHARDLIMIT_CONFIG (a path or inline JSON); without it the in-memory
engine runs a demo limit (5 requests per 10 s, sliding window). Requests are limited per
client IP (X-Forwarded-For is believed only from $SHARDLIMIT_TRUSTED_PROXIES, comma-separated
CIDRs); GET /health is not limited. Every limited response carries the X-RateLimit-*,
RateLimit and RateLimit-Policy headers; a denied request gets 429, Retry-After and the JSON
body, and never reaches the route.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional, Union

from fastapi import FastAPI

import shardlimit
from shardlimit.asgi import RateLimitMiddleware, Target
from shardlimit.asgi import Request as AsgiRequest


def create_app(limiter: shardlimit.Limiter, policy: Union[str, shardlimit.Limit],
               trusted_proxies: list[str]) -> FastAPI:
    app = FastAPI(title="shardlimit example")

    def rule(request: AsgiRequest) -> Optional[Target]:
        if request.path == "/health" or request.client_ip is None:
            return None
        return (f"ip:{request.client_ip}", policy)

    app.add_middleware(RateLimitMiddleware, limiter=limiter, rule=rule,
                       trusted_proxies=trusted_proxies)

    @app.get("/")
    async def index() -> dict:
        return {"hello": "world"}

    @app.get("/hello/{name}")
    async def hello(name: str) -> dict:
        return {"hello": name}

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description="FastAPI service limited by shardlimit")
    ap.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    ap.add_argument("--policy", default=os.environ.get("SHARDLIMIT_POLICY", "api"))
    args = ap.parse_args()
    trusted = [s.strip() for s in os.environ.get("SHARDLIMIT_TRUSTED_PROXIES", "").split(",") if s.strip()]
    policy: Union[str, shardlimit.Limit]
    if os.environ.get("SHARDLIMIT_CONFIG"):
        limiter = shardlimit.Limiter.from_env()
        policy = args.policy
        limiter.peek("startup", policy)  # an unknown policy fails here, not per request
        engine = "redis" if limiter.is_redis else "in-memory"
    else:
        limiter = shardlimit.Limiter.memory()
        policy = shardlimit.Limit.sliding_window(5, window=10)
        engine = "in-memory (no config: 5 per 10 s)"
    name = args.policy if isinstance(policy, str) else "demo"
    print(f"listening on http://127.0.0.1:{args.port} engine={engine} policy={name}", flush=True)
    uvicorn.run(create_app(limiter, policy, trusted), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
