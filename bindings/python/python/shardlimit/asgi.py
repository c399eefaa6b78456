"""ASGI middleware (Starlette, FastAPI, any ASGI 3 app).

    from shardlimit.asgi import RateLimitMiddleware
    app.add_middleware(RateLimitMiddleware, limiter=limiter, policy="api")

Every checked response carries the rate-limit headers; a denied request gets a 429 with the
core's JSON body and never reaches the app. Checks run on the limiter's own I/O runtime and
never block the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, MutableMapping
from typing import Any, Callable, Optional

from ._http import Checker, PolicyLike, Request, Rule, Target, by_client_ip, too_many_requests
from ._shardlimit import Limiter

__all__ = ["RateLimitMiddleware", "Request", "Rule", "Target", "by_client_ip"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers") or ():
        k = name.decode("latin-1").lower()
        v = value.decode("latin-1")
        out[k] = f"{out[k]}, {v}" if k in out else v
    return out


class RateLimitMiddleware:
    """Limits HTTP requests of an ASGI app.

    ``rule(request) -> (key, policy[, cost]) | None`` picks what to check (None: don't);
    or pass ``policy=`` to limit by client address. ``trusted_proxies`` lists the proxy
    addresses or CIDRs whose ``X-Forwarded-For`` is believed.
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        rule: Optional[Rule] = None,
        *,
        policy: Optional[PolicyLike] = None,
        trusted_proxies: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.checker = Checker(limiter, rule, policy, trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        request = self.checker.request(
            scope.get("method", "GET"),
            scope.get("path", "/"),
            _headers(scope),
            client[0] if client else None,
            scope,
        )
        target = self.checker.rule(request)
        if target is None:
            await self.app(scope, receive, send)
            return
        decision = await self.checker.acheck(target)
        if not decision:
            headers, body = too_many_requests(decision)
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        extra = [(k.lower().encode(), v.encode()) for k, v in decision.headers().items()]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers") or ()) + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)

