"""ASGI middleware and route limits (Starlette, FastAPI, any ASGI 3 app).

    limits = RouteLimits(limiter)                    # key: the client address

    @app.post("/login")
    @limits.limit("5/minute")
    async def login(): ...

    app.add_middleware(RateLimitMiddleware, limiter=limiter, routes=limits)

Route limits are found on the endpoint Starlette's routing picks (mounts and routers
included), not on the raw path. A denied request gets a 429 with the core's JSON body, or a
503 when the limit could not be checked and the policy's fallback denied; checked responses
carry one set of rate-limit headers. The decision is ``request.state.shardlimit``. Checks run
on the limiter's own I/O runtime and never block the event loop; the lifespan start-up
connects to every shard first (``warm_up`` seconds at most), and fails (the server does not
start) when a route carries limits of a ``RouteLimits`` that no ``RateLimitMiddleware``
was given. A decorated route of an app with no such middleware at all raises when called.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Iterable, MutableMapping
from typing import Any, Callable, Optional

from ._errors import Error
from ._http import (
    LazyHeaders,
    Checker,
    Layer,
    Options,
    PolicyLike,
    Request,
    Rule,
    Target,
    awarm_up,
    by_client_ip,
    denial,
    has_raw_rate_headers,
    layers,
    raw_rate_headers,
)
from ._routes import RouteLimits, client_ip_key
from ._shardlimit import Decision, Limiter

__all__ = [
    "RateLimitMiddleware",
    "RouteLimits",
    "Request",
    "Rule",
    "Target",
    "by_client_ip",
    "client_ip_key",
]

log = logging.getLogger("shardlimit")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: A custom answer to a denied request: returns an ASGI app (a Starlette ``Response``),
#: or an awaitable of one.
Handler = Callable[[Request, Decision], Any]


class _Unenforced(RuntimeError):
    """Route limits that no middleware enforces, found at the app's start-up."""


#: How many (method, path, host) a middleware remembers the endpoint of.
ENDPOINT_CACHE = 4096


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers") or ():
        k = name.decode("latin-1").lower()
        v = value.decode("latin-1")
        out[k] = f"{out[k]}, {v}" if k in out else v
    return out


def _forwarded_for(scope: Scope) -> Optional[str]:
    """The X-Forwarded-For headers, joined with ", " (None: there is none)."""
    found = [v.decode("latin-1") for k, v in scope.get("headers") or ()
             if k.lower() == b"x-forwarded-for"]
    return ", ".join(found) if found else None


def find_endpoint(app: Any, scope: Scope) -> Optional[Callable[..., object]]:
    """The endpoint Starlette's router would call for ``scope``, through mounts and hosts;
    None for a path no route matches or an app that is not Starlette's."""
    routes = getattr(app, "routes", None)
    if routes is None:
        return None
    from starlette.routing import Host, Match, Mount

    def one(route: Any, scope: Scope) -> tuple[bool, Optional[Callable[..., object]]]:
        included = getattr(route, "_match", None)
        if included is not None:
            # FastAPI >= 0.120 keeps included routers as one route (_IncludedRouter) that
            # picks among its own candidates
            match, child, inner, _ = included(dict(scope))
            if match != Match.FULL or inner is None:
                return False, None
            if getattr(inner, "_match", None) is not None:
                return one(inner, {**scope, **child})
            return True, getattr(inner, "endpoint", None)
        match, child = route.matches(scope)
        if match != Match.FULL:
            return False, None
        if isinstance(route, (Mount, Host)):
            return True, walk(route.routes, {**scope, **child})
        return True, getattr(route, "endpoint", None)

    def walk(routes: Iterable[Any], scope: Scope) -> Optional[Callable[..., object]]:
        for route in routes:
            matched, endpoint = one(route, scope)
            if matched:
                return endpoint
        return None

    return walk(routes, scope)


async def _answer(app: Any, scope: Scope, receive: Receive, send: Send) -> None:
    if inspect.isawaitable(app):
        app = await app
    await app(scope, receive, send)


def unenforced_routes(app: Any) -> list[str]:
    """The endpoints among ``app``'s routes (through mounts, hosts, included routers and the
    middlewares wrapping it) that carry route limits no middleware enforces: decorated by a
    :class:`RouteLimits` that was never given to ``RateLimitMiddleware(routes=...)``. A
    mounted app's own middleware counts once declared (Starlette builds it on its first
    request)."""
    found: list[tuple[RouteLimits, str]] = []
    declared: set[int] = set()
    seen: set[int] = set()

    def visit(node: Any, depth: int) -> None:
        if node is None or depth > 64 or id(node) in seen:
            return
        seen.add(id(node))
        for m in getattr(node, "user_middleware", None) or ():
            cls = getattr(m, "cls", None)
            routes = (getattr(m, "kwargs", None) or {}).get("routes")
            if isinstance(cls, type) and issubclass(cls, RateLimitMiddleware) and routes is not None:
                declared.add(id(routes))
        endpoint = getattr(node, "endpoint", None)
        owner = getattr(endpoint, "__shardlimit_routes__", None)
        if isinstance(owner, RouteLimits) and not owner.installed:
            path = getattr(node, "path", None)
            name = getattr(endpoint, "__qualname__", repr(endpoint))
            found.append((owner, f"{name} ({path})" if path else name))
        try:
            routes = getattr(node, "routes", None)
        except Exception:  # (a property of a framework object that cannot answer yet)
            routes = None
        if routes is not None and not isinstance(routes, (str, bytes)):
            for route in routes:
                visit(route, depth + 1)
        # a middleware wrapping the app that has the routes, a mount's app (its own
        # middlewares), an included router of FastAPI's
        for inner in ("app", "_base_app", "original_router", "router"):
            visit(getattr(node, inner, None), depth + 1)

    visit(app, 0)
    return [name for owner, name in found if id(owner) not in declared]


class RateLimitMiddleware:
    """Limits HTTP requests of an ASGI app.

    ``routes``: a :class:`RouteLimits` whose decorators mark endpoints. ``rule(request) ->
    (key, policy[, cost]) | [layers] | None`` limits every request (None: not this one), or
    ``policy=`` limits every request by client address; both add to the route limits.
    ``trusted_proxies`` lists the proxies whose ``X-Forwarded-For`` is believed.
    ``headers``/``retry_after``/``outage_retry_after``: see :class:`shardlimit._http.Options`.
    ``on_limited(request, decision)`` and ``on_unavailable(request, decision)`` answer a
    429 and a 503 instead of the JSON default; the rate headers are added unless the
    response has its own. A policy with ``on_error: error`` raises the core's error, which
    reaches the app's exception handlers (``@app.exception_handler(shardlimit.BackendError)``).
    ``deduct_when(status) -> bool``: count only the requests whose response status it
    accepts (``lambda s: s >= 400``: failures only; ``lambda s: s < 400``: successes only):
    each request reserves its units atomically, and they are given back to the window that
    admitted them when the status does not count (a request whose app raised counts).
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        rule: Optional[Rule] = None,
        *,
        policy: Optional[PolicyLike] = None,
        routes: Optional[RouteLimits] = None,
        trusted_proxies: Iterable[str] = (),
        headers: str = "both",
        retry_after: str = "seconds",
        outage_retry_after: int = 1,
        on_limited: Optional[Handler] = None,
        on_unavailable: Optional[Handler] = None,
        warm_up: float = 5.0,
        deduct_when: Optional[Callable[[int], bool]] = None,
    ) -> None:
        self.app = app
        self.deduct_when = deduct_when
        self.checker = Checker(limiter, rule, policy, trusted_proxies, routes=routes is not None)
        self.routes = routes
        if routes is not None:
            routes.installed = True
        self.options = Options(headers, retry_after, outage_retry_after)
        self.on_limited = on_limited
        self.on_unavailable = on_unavailable
        self.warm_up = warm_up
        self._endpoints: dict[tuple[Any, ...], Optional[Callable[..., object]]] = {}

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receive_after_warm_up() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.startup":
                # a route whose limits nothing enforces would run unlimited: the app does
                # not start (every middleware of the app exists by now)
                missing = unenforced_routes(scope.get("app") or self.app)
                if missing:
                    raise _Unenforced(
                        "shardlimit: route limits that no middleware enforces on "
                        f"{', '.join(missing)}: pass their RouteLimits to "
                        "RateLimitMiddleware(routes=...)")
                failed = await awarm_up(self.checker.limiter, self.warm_up)
                if failed:
                    log.warning("shardlimit: warm-up incomplete, the first checks may fall back: %s",
                                failed)
            return message

        failed_sent = False

        async def watch(message: Message) -> None:
            nonlocal failed_sent
            failed_sent = failed_sent or message.get("type") == "lifespan.startup.failed"
            await send(message)

        try:
            await self.app(scope, receive_after_warm_up, watch)
        except _Unenforced as e:
            # (a server treats an exception before start-up as "no lifespan support" and
            # serves anyway: the failure is said in the protocol's own words)
            if not failed_sent:
                await send({"type": "lifespan.startup.failed", "message": str(e)})

    def _request(self, scope: Scope) -> Request:
        client = scope.get("client")
        return self.checker.request(
            scope.get("method", "GET"),
            scope.get("path", "/"),
            LazyHeaders(_headers, scope),
            client[0] if client else None,
            scope,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await self._lifespan(scope, receive, send)
            elif kind == "websocket" and self.routes is not None:
                await self._websocket(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        checker = self.checker
        request: Optional[Request] = None
        target: Optional[Target]
        deducts: list[tuple[Layer, Optional[Callable[[Any], bool]]]]
        if self.routes is None and checker.by_ip is not None:
            # the lean path of policy=: the key from the client address (remembered per
            # address), no Request unless a denial's handler needs one
            client = scope.get("client")
            target = checker.ip_target(
                client[0] if client else None,
                _forwarded_for(scope) if checker.reads_forwarded_for else None,
            )
            deducts = [] if target is None else [(target, self.deduct_when)]
        else:
            endpoint = None
            if self.routes is not None:
                endpoint = self._endpoint(scope)
                if self.routes.is_exempt(endpoint):
                    await self.app(scope, receive, send)
                    return
            request = self._request(scope)
            deducts = self._deducts(endpoint, request)
            checks = [layer for layer, _ in deducts]
            target = None if not checks else checks if len(checks) > 1 else checks[0]
        if target is None:
            await self.app(scope, receive, send)
            return
        reserve = self.deduct_when is not None or any(w is not None for _, w in deducts)
        try:
            decision, counted, leases = await checker.aenter(target, reserve=reserve)
        except Error as e:
            await self._error(e, scope, receive, send)
            return
        state = scope.get("state")
        if state is None:
            scope["state"] = {"shardlimit": decision}
        else:
            state["shardlimit"] = decision
        extra = raw_rate_headers(decision, self.options)

        if not decision:
            outage = decision.source == "fallback"
            handler = self.on_unavailable if outage else self.on_limited
            if handler is not None:
                if request is None:
                    request = self._request(scope)

                async def send_denial(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        own = list(message.get("headers") or ())
                        if not has_raw_rate_headers(own):
                            message = dict(message)
                            message["headers"] = own + extra
                    await send(message)

                await _answer(handler(request, decision), scope, receive, send_denial)
                return
            status, hdrs, body = denial(decision, self.options)
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return

        sent_status: list[int] = []

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent_status.append(int(message.get("status", 200)))
                own = list(message.get("headers") or ())
                if not has_raw_rate_headers(own):
                    message = dict(message)
                    message["headers"] = own + extra
            await send(message)

        if not leases and counted is None:
            # nothing to give back when the response ends
            await self.app(scope, receive, send_with_headers)
            return
        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            # the response is sent (or the app raised, or the request was cancelled on a
            # client disconnect): a concurrency policy's lease goes back
            if leases:
                await self.checker.aleave(leases)
        if counted is not None and sent_status:
            back = self.checker.uncounted(target, counted, deducts, sent_status[0])
            if back is not None:
                try:
                    await self.checker.agive_back(back)
                except Error:  # the response is sent; the units stay counted
                    log.warning("shardlimit: giving back a request's units failed", exc_info=True)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket connection to a decorated endpoint is checked once, when it opens
        (its route limits only: the middleware's own rule limits HTTP requests). A denial
        closes it before it is accepted (code 1008, policy violation: the server answers
        the handshake with 403); a concurrency policy's lease is held until it closes."""
        assert self.routes is not None
        endpoint = self._endpoint(scope)
        checks = [] if self.routes.is_exempt(endpoint) else \
            self.routes.layers_for(endpoint, self._request(scope))
        if not checks:
            await self.app(scope, receive, send)
            return
        decision, _, leases = await self.checker.aenter(checks if len(checks) > 1 else checks[0])
        if not decision:
            message = await receive()  # websocket.connect
            if message.get("type") == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008,
                            "reason": "rate limited" if decision.source != "fallback"
                            else "rate limit unavailable"})
            return
        state = scope.get("state")
        if state is None:
            scope["state"] = {"shardlimit": decision}
        else:
            state["shardlimit"] = decision
        try:
            await self.app(scope, receive, send)
        finally:
            if leases:
                await self.checker.aleave(leases)

    def _deducts(self, endpoint: Optional[Callable[..., object]],
                 request: Request) -> list[tuple[Layer, Optional[Callable[[Any], bool]]]]:
        """The request's layers, each with the ``deduct_when`` that decides whether it
        counts: its route limit's own, else the middleware's. The middleware's own rule
        does not apply to a route whose limits say ``override_defaults``."""
        out: list[tuple[Layer, Optional[Callable[[Any], bool]]]] = []
        if self.routes is None or not self.routes.overrides_defaults(endpoint):
            out += [(layer, self.deduct_when) for layer in layers(self.checker.rule(request))]
        if self.routes is not None:
            out += [(layer, when if when is not None else self.deduct_when)
                    for layer, when in self.routes.layers_with(endpoint, request)]
        return out

    def _endpoint(self, scope: Scope) -> Optional[Callable[..., object]]:
        """:func:`find_endpoint`, remembered per (method, path, host) for the last
        :data:`ENDPOINT_CACHE` distinct requests: matching costs as much as the router's own."""
        host = next((v for k, v in scope.get("headers") or () if k == b"host"), b"")
        key = (scope.get("method"), scope.get("root_path", ""), scope.get("path"), host)
        try:
            return self._endpoints[key]
        except KeyError:
            pass
        # (scope["app"] is set by Starlette when it runs the middleware; a middleware that
        # wraps the Starlette app itself finds the routes on the app it wraps)
        endpoint = find_endpoint(scope.get("app") or self.app, scope)
        if len(self._endpoints) >= ENDPOINT_CACHE:
            self._endpoints.clear()  # bounded: paths are the client's to choose
        self._endpoints[key] = endpoint
        return endpoint

    async def _error(self, error: Error, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's exception handler for ``error`` (Starlette's ``exception_handlers``,
        looked up along the class tree as Starlette does), else the error is raised."""
        app = scope.get("app")
        handlers = getattr(app, "exception_handlers", None) or {}
        for cls in type(error).__mro__:
            handler = handlers.get(cls)
            if handler is not None:
                from starlette.requests import Request as StarletteRequest

                await _answer(handler(StarletteRequest(scope, receive), error), scope, receive,
                              send)
                return
        raise error
