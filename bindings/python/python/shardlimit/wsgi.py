"""WSGI middleware (Flask, Django, any WSGI app).

    from shardlimit.wsgi import RateLimitMiddleware
    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter, policy="api")

Every checked response carries one set of rate-limit headers; a denied request gets a 429
with the core's JSON body (a 503 when the limit could not be checked) and never reaches the
app. The check releases the GIL while it waits on
Redis, so threaded servers check in parallel.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Callable, Optional

from ._http import (
    LazyHeaders,
    STATUS_LINES,
    Checker,
    Options,
    PolicyLike,
    Request,
    Rule,
    Target,
    by_client_ip,
    denial,
    has_rate_header_pairs,
    hold,
    is_outage,
    rate_headers,
)
from ._http import warm_up as _warm_up
from ._shardlimit import Decision, Lease, Limiter

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["RateLimitMiddleware", "Request", "Rule", "Target", "by_client_ip"]

log = logging.getLogger("shardlimit")
#: A custom answer to a denied request: returns a WSGI app (a werkzeug ``Response``).
Handler = Callable[[Request, Decision], Any]


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

    ``rule(request) -> (key, policy[, cost]) | [layers] | None`` picks what to check (None:
    don't); or pass ``policy=`` to limit by client address. ``trusted_proxies`` lists the
    proxy addresses or CIDRs whose ``X-Forwarded-For`` is believed. ``headers``,
    ``retry_after``, ``outage_retry_after``: see :class:`shardlimit._http.Options`; a
    fallback that denies answers 503, never 429. ``on_limited(request, decision)`` and
    ``on_unavailable(request, decision)`` return a WSGI app (a werkzeug ``Response``) to
    answer instead. The decision is ``environ["shardlimit.decision"]``. The limiter
    connects to every shard when the middleware is built (``warm_up`` seconds at most).
    For Flask, :mod:`shardlimit.flask` checks inside the app instead, so that route
    decorators work and errors reach ``@app.errorhandler``.
    """

    def __init__(
        self,
        app: WSGIApplication,
        limiter: Limiter,
        rule: Optional[Rule] = None,
        *,
        policy: Optional[PolicyLike] = None,
        trusted_proxies: Iterable[str] = (),
        headers: str = "both",
        retry_after: str = "seconds",
        outage_retry_after: int = 1,
        on_limited: Optional[Handler] = None,
        on_unavailable: Optional[Handler] = None,
        warm_up: float = 5.0,
    ) -> None:
        self.app = app
        self.checker = Checker(limiter, rule, policy, trusted_proxies)
        self.options = Options(headers, retry_after, outage_retry_after)
        self._x_ratelimit = self.options.x_ratelimit
        self._ietf = self.options.ietf
        self.on_limited = on_limited
        self.on_unavailable = on_unavailable
        failed = _warm_up(limiter, warm_up)
        if failed:
            log.warning("shardlimit: warm-up incomplete, the first checks may fall back: %s", failed)

    def _request(self, environ: WSGIEnvironment) -> Request:
        return self.checker.request(
            environ.get("REQUEST_METHOD", "GET"),
            environ.get("PATH_INFO", "/"),
            LazyHeaders(_headers, environ),
            environ.get("REMOTE_ADDR") or None,
            environ,
        )

    def __call__(
        self, environ: WSGIEnvironment, start_response: StartResponse
    ) -> Iterable[bytes]:
        checker = self.checker
        request: Optional[Request] = None
        target: Optional[Target]
        leases: list[Lease]
        if checker.by_ip is not None:
            # the lean path of policy=: the key from the client address (remembered per
            # address), no Request unless a denial's handler needs one
            target = checker.ip_target(
                environ.get("REMOTE_ADDR") or None,
                environ.get("HTTP_X_FORWARDED_FOR") if checker.reads_forwarded_for else None,
            )
            if target is None:
                return self.app(environ, start_response)
            if checker.is_concurrency(target[1]):
                decision, _, leases = checker.enter(target)
            else:
                # one check, no lease: one call into the core (Checker.enter's work less
                # its branches)
                decision = hold(checker.limiter.check(target[0], target[1]))
                leases = []
        else:
            request = self._request(environ)
            target = checker.rule(request)
            if target is None:
                return self.app(environ, start_response)
            decision, _, leases = checker.enter(target)
        environ["shardlimit.decision"] = decision
        # an admission's headers: one call into the core's rendering (rate_headers adds
        # what only a denial has)
        extra = decision._wire_headers(self._x_ratelimit, self._ietf, time.time(), False) \
            if decision else rate_headers(decision, self.options)

        def start_with_headers(
            status: str,
            headers: list[tuple[str, str]],
            exc_info: Optional[OptExcInfo] = None,
            /,
        ) -> Callable[[bytes], object]:
            if not has_rate_header_pairs(headers):
                headers = list(headers) + extra
            return start_response(status, headers, exc_info)

        if not decision:
            handler = self.on_unavailable if is_outage(decision) else self.on_limited
            if handler is not None:
                if request is None:
                    request = self._request(environ)
                answer: Iterable[bytes] = handler(request, decision)(environ, start_with_headers)
                return answer
            status, hdrs, body = denial(decision, self.options)
            start_response(STATUS_LINES[status], hdrs)
            return [body]
        if not leases:
            return self.app(environ, start_with_headers)
        try:
            response = self.app(environ, start_with_headers)
        except BaseException:
            self.checker.leave(leases)
            raise
        return _Released(response, lambda: self.checker.leave(leases))


class _Released:
    """The app's response iterable; closing it (the server does when the response ends,
    sent or not: PEP 3333) closes the app's and releases the request's leases, once."""

    def __init__(self, body: Iterable[bytes], release: Callable[[], None]) -> None:
        self._body = body
        self._release: Optional[Callable[[], None]] = release

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()
