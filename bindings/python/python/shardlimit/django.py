"""Django: a per-view decorator (sync and async views).

    from shardlimit.django import limit

    @limit(limiter, "5/minute")                        # key: the client address
    def login(request): ...

    @limit(limiter, "api", key=lambda req: req.headers.get("x-api-key"))
    async def report(request): ...

A denial answers 429 with the core's JSON body (503 when the limit could not be checked
and the fallback denied), with one set of rate-limit headers, as the other middlewares
do; an allowed response gets the headers too, and the decision is ``request.shardlimit``.
The key function gets shardlimit's ``Request`` (``.raw`` is Django's ``HttpRequest``);
the Redis key follows the route decorators' rules (``shardlimit._routes``: a config
policy by name keys by the key function's key, a rate string by the view's qualified name
and the key). A policy with ``on_error: error`` raises the core's error into Django's own
handling. Each ``@limit`` is one check; stacked ones check one after the other.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from typing import Any, Callable, Optional, TypeVar

from ._http import Checker, LazyHeaders, Options, denial, has_rate_headers, rate_headers
from ._routes import Cost, DeductWhen, KeyFunc, LimitLike, RouteLimits
from ._shardlimit import Decision, Limiter

__all__ = ["limit"]

V = TypeVar("V", bound=Callable[..., Any])


def _headers(request: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


def limit(
    limiter: Limiter,
    limit: LimitLike,
    *,
    key: Optional[KeyFunc] = None,
    cost: Cost = 1,
    scope: Optional[str] = None,
    deduct_when: Optional[DeductWhen] = None,
    trusted_proxies: Iterable[str] = (),
    headers: str = "both",
    retry_after: str = "seconds",
    outage_retry_after: int = 1,
) -> Callable[[V], V]:
    """``@limit(limiter, "5/minute")``: limits a Django view, per key (the client
    address unless ``key(request) -> str | None`` says otherwise; None skips the limit for
    that request). ``cost``, ``scope`` and ``deduct_when(response) -> bool`` (count only
    the responses it accepts) as the route decorators'; ``trusted_proxies`` lists the
    proxies whose ``X-Forwarded-For`` is believed; ``headers``, ``retry_after`` and
    ``outage_retry_after`` as the middlewares'. A bad argument raises here, naming it."""
    routes = RouteLimits(limiter, key=key)
    routes.installed = True  # this decorator is the middleware that enforces it
    record = routes.limit(limit, cost=cost, scope=scope, deduct_when=deduct_when)
    checker = Checker(limiter, None, None, trusted_proxies, routes=True)
    options = Options(headers, retry_after, outage_retry_after)

    def layers_of(view: Callable[..., Any], request: Any) -> list[Any]:
        req = checker.request(request.method or "GET", request.path,
                              LazyHeaders(_headers, request), request.META.get("REMOTE_ADDR"),
                              request)
        return routes.layers_with(view, req)

    def deny(decision: Decision) -> Any:
        from django.http import HttpResponse

        status, hdrs, body = denial(decision, options)
        response = HttpResponse(body, status=status)
        for name, value in hdrs:
            response[name] = value
        return response

    def finish(decision: Decision, response: Any) -> Any:
        if not has_rate_headers(response.headers.keys()):
            for name, value in rate_headers(decision, options):
                response[name] = value
        return response

    def decorate(view: V) -> V:
        record(view)
        if inspect.iscoroutinefunction(view):
            @functools.wraps(view)
            async def limited_async(request: Any, *args: Any, **kwargs: Any) -> Any:
                deducts = layers_of(view, request)
                if not deducts:
                    return await view(request, *args, **kwargs)
                target = deducts[0][0]
                decision, counted, leases = await checker.aenter(
                    target, reserve=deducts[0][1] is not None)
                if not decision:
                    return deny(decision)
                request.shardlimit = decision
                try:
                    response = await view(request, *args, **kwargs)
                finally:
                    if leases:
                        await checker.aleave(leases)
                back = checker.uncounted(target, counted, deducts, response)
                if back is not None:
                    await checker.agive_back(back)
                return finish(decision, response)

            return limited_async  # type: ignore[return-value]

        @functools.wraps(view)
        def limited(request: Any, *args: Any, **kwargs: Any) -> Any:
            deducts = layers_of(view, request)
            if not deducts:
                return view(request, *args, **kwargs)
            target = deducts[0][0]
            decision, counted, leases = checker.enter(target, reserve=deducts[0][1] is not None)
            if not decision:
                return deny(decision)
            request.shardlimit = decision
            try:
                response = view(request, *args, **kwargs)
            finally:
                if leases:
                    checker.leave(leases)
            back = checker.uncounted(target, counted, deducts, response)
            if back is not None:
                checker.give_back(back)
            return finish(decision, response)

        return limited  # type: ignore[return-value]

    return decorate
