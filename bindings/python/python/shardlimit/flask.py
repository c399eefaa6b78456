"""Flask route limits.

    limits = FlaskLimits(limiter, app)               # key: the client address

    @app.post("/login")
    @limits.limit("5/minute")
    def login(): ...

The check runs in ``before_request`` on the endpoint Flask matched (blueprints and
prefixes included), so a policy with ``on_error: error`` raises inside Flask and reaches
``@app.errorhandler(shardlimit.BackendError)``. A denial answers 429 with the core's JSON
body, or 503 when the limit could not be checked and the fallback denied; every checked
response carries one set of rate-limit headers; the decision is ``flask.g.shardlimit``.

Route limits that no FlaskLimits bound to the app enforces (a view or Blueprint decorated by
a FlaskLimits bound to another app, or by an ASGI ``RouteLimits``) would run unlimited:
Flask has no start-up event, so the app's first request (when Flask closes its set-up)
finds them, and that request and every later one raise a ``RuntimeError`` naming them.
``unenforced_routes(app)`` lists them, for a check at the end of an app factory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Callable, Optional

from flask import Flask, Response, g, request

from ._http import (
    LazyHeaders,
    Checker,
    Layer,
    Options,
    PolicyLike,
    Request,
    Rule,
    denial,
    has_rate_headers,
    is_outage,
    layers,
    rate_headers,
    warm_up,
)
from ._routes import KeyFunc, RouteLimits, client_ip_key, limited_by
from ._shardlimit import Decision, Limiter

__all__ = ["FlaskLimits", "client_ip_key", "unenforced_routes"]

log = logging.getLogger("shardlimit")
#: A custom answer to a denied request: any Flask view return value.
Handler = Callable[[Request, Decision], Any]


def _lower_headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def unenforced_routes(app: Flask) -> list[str]:
    """The views and Blueprints of ``app`` carrying route limits that no FlaskLimits bound to
    ``app`` enforces: they would run unlimited."""
    enforced = {id(x) for x in app.extensions.get("shardlimit", {}).get("limits", ())}
    found: list[str] = []
    for rule in app.url_map.iter_rules():
        view = app.view_functions.get(rule.endpoint)
        views = (view, getattr(view, "__wrapped__", None))
        if any(id(rl) not in enforced for v in views if v is not None for rl in limited_by(v)):
            found.append(f"{rule.endpoint} ({rule.rule})")
    for name, bp in app.blueprints.items():
        if any(id(rl) not in enforced for rl in limited_by(bp)):
            found.append(f"Blueprint {name!r}")
    return found


class FlaskLimits(RouteLimits):
    """Route decorators (:meth:`limit`, :meth:`shared_limit`, :meth:`exempt`) for Flask.

    ``rule``/``policy`` add a limit to every request, as the WSGI middleware's do.
    ``headers``, ``retry_after``, ``outage_retry_after``, ``on_limited``,
    ``on_unavailable``, ``trusted_proxies`` and ``warm_up``: as the middlewares'.
    ``deduct_when(response) -> bool`` (Flask-Limiter's): count only the requests whose
    response it accepts (e.g. ``lambda r: r.status_code >= 400`` counts failures only): each
    request reserves its units atomically, and they are given back to the window that
    admitted them when the response does not count. A route's ``@limits.limit(...,
    deduct_when=...)`` decides for that limit alone. ``limits.limit("100/hour")(blueprint)``
    limits every route of a Blueprint (one budget per Blueprint and key).
    """

    def __init__(
        self,
        limiter: Limiter,
        app: Optional[Flask] = None,
        *,
        key: Optional[KeyFunc] = None,
        rule: Optional[Rule] = None,
        policy: Optional[PolicyLike] = None,
        trusted_proxies: Iterable[str] = (),
        headers: str = "both",
        retry_after: str = "seconds",
        outage_retry_after: int = 1,
        on_limited: Optional[Handler] = None,
        on_unavailable: Optional[Handler] = None,
        warm_up: float = 5.0,
        deduct_when: Optional[Callable[[Response], bool]] = None,
    ) -> None:
        super().__init__(limiter, key=key)
        self.deduct_when = deduct_when
        self.checker = Checker(limiter, rule, policy, trusted_proxies, routes=True)
        self.options = Options(headers, retry_after, outage_retry_after)
        self.on_limited = on_limited
        self.on_unavailable = on_unavailable
        self.warm_up = warm_up
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Installs the checks on ``app`` and connects to every shard."""
        self.installed = True
        state = app.extensions.setdefault("shardlimit", {"limits": [], "unenforced": None})
        state["limits"].append(self)
        state["unenforced"] = None  # (checked again on the next request)
        app.before_request(self._before)
        app.after_request(self._after)
        app.teardown_request(self._teardown)
        failed = warm_up(self.limiter, self.warm_up)
        if failed:
            log.warning("shardlimit: warm-up incomplete, the first checks may fall back: %s", failed)

    def _before(self) -> Any:
        from flask import current_app

        state = current_app.extensions["shardlimit"]
        if state["unenforced"] is None:
            state["unenforced"] = unenforced_routes(current_app)
        if state["unenforced"]:
            raise RuntimeError(
                "shardlimit: route limits that no FlaskLimits bound to this app enforces "
                f"(they would run unlimited): {', '.join(state['unenforced'])}; decorate them "
                "with a FlaskLimits bound to this app (FlaskLimits(limiter, app) or init_app(app))")
        endpoint = current_app.view_functions.get(request.endpoint or "")
        if self.is_exempt(endpoint):
            return None
        view = self.checker.request(
            request.method,
            request.path,
            LazyHeaders(_lower_headers, request.headers),
            request.remote_addr,
            request,
        )
        deducts: list[tuple[Layer, Optional[Callable[[Any], bool]]]] = []
        if not self.overrides_defaults(endpoint):
            deducts += [(layer, self.deduct_when) for layer in layers(self.checker.rule(view))]
        # a limit on a Blueprint (limits.limit(...)(bp)) covers its routes, nested ones too
        for name in request.blueprints:
            bp = current_app.blueprints.get(name)
            if bp is not None:
                deducts += [(layer, when if when is not None else self.deduct_when)
                            for layer, when in self.layers_with(bp, view)]
        deducts += [(layer, when if when is not None else self.deduct_when)
                    for layer, when in self.layers_with(endpoint, view)]
        checks = [layer for layer, _ in deducts]
        if not checks:
            return None
        target = checks if len(checks) > 1 else checks[0]
        reserve = any(when is not None for _, when in deducts)
        decision, counted, leases = self.checker.enter(target, reserve=reserve)
        if counted is not None:
            g.shardlimit_counted = (target, counted, deducts)
        if leases:
            g.shardlimit_leases = leases  # released in teardown, also when the view raised
        g.shardlimit = decision
        if decision:
            return None
        handler = self.on_unavailable if is_outage(decision) else self.on_limited
        if handler is not None:
            return handler(view, decision)
        status, hdrs, body = denial(decision, self.options)
        return Response(body, status=status, headers=hdrs)

    def _after(self, response: Response) -> Response:
        decision = g.get("shardlimit")
        counted = g.pop("shardlimit_counted", None)
        back = None
        if counted is not None:
            target, reserved, deducts = counted
            back = self.checker.uncounted(target, reserved, deducts, response)
        if back is not None:
            try:
                self.checker.give_back(back)
            except Exception:  # the response stands; the units stay counted
                log.warning("shardlimit: giving back a request's units failed", exc_info=True)
        if decision is not None and not has_rate_headers(response.headers.keys()):
            # (none of these is set: one extend, not a replacing assignment each)
            response.headers.extend(rate_headers(decision, self.options))
        return response

    def _teardown(self, error: Optional[BaseException]) -> None:
        leases = g.pop("shardlimit_leases", None)
        if leases:
            self.checker.leave(leases)
