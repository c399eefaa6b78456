"""WSGI middleware (Flask, Django, any WSGI app).

    from shardlimit.wsgi import RateLimitMiddleware
    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter, policy="api")

Every checked response carries the rate-limit headers; a denied request gets a 429 with the
core's JSON body and never reaches the app. The check releases the GIL while it waits on
Redis, so threaded servers check in parallel.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Callable, Optional

from ._http import Checker, PolicyLike, Request, Rule, Target, by_client_ip, too_many_requests
from ._shardlimit import Limiter

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["RateLimitMiddleware", "Request", "Rule", "Target", "by_client_ip"]


def _headers(environ: WSGIEnvironment) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in environ.items():
        if k.startswith("HTTP_"):
            out[k[5:].replace("_", "-").lower()] = v
    if environ.get("CONTENT_TYPE"):
        out["content-type"] = environ["CONTENT_TYPE"]
    if environ.get("CONTENT_LENGTH"):
        out["content-length"] = environ["CONTENT_LENGTH"]
    return out


class RateLimitMiddleware:
    """Limits requests of a WSGI app.

    ``rule(request) -> (key, policy[, cost]) | None`` picks what to check (None: don't);
    or pass ``policy=`` to limit by client address. ``trusted_proxies`` lists the proxy
    addresses or CIDRs whose ``X-Forwarded-For`` is believed.
    """

    def __init__(
        self,
        app: WSGIApplication,
        limiter: Limiter,
        rule: Optional[Rule] = None,
        *,
        policy: Optional[PolicyLike] = None,
        trusted_proxies: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.checker = Checker(limiter, rule, policy, trusted_proxies)

    def __call__(
        self, environ: WSGIEnvironment, start_response: StartResponse
    ) -> Iterable[bytes]:
        request = self.checker.request(
            environ.get("REQUEST_METHOD", "GET"),
            environ.get("PATH_INFO", "/"),
            _headers(environ),
            environ.get("REMOTE_ADDR") or None,
            environ,
        )
        target = self.checker.rule(request)
        if target is None:
            return self.app(environ, start_response)
        decision = self.checker.check(target)
        if not decision:
            headers, body = too_many_requests(decision)
            start_response("429 Too Many Requests", headers)
            return [body]
        extra = list(decision.headers().items())

        def start_with_headers(
            status: str,
            headers: list[tuple[str, str]],
            exc_info: Optional[OptExcInfo] = None,
            /,
        ) -> Callable[[bytes], object]:
            return start_response(status, list(headers) + extra, exc_info)

        return self.app(environ, start_with_headers)


