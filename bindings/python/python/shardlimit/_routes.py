"""Route-level limits, shared by the ASGI middleware and the Flask extension: decorators
that record limits on an endpoint (the function a route calls), looked up after the
framework's own routing has chosen the endpoint, so mounts, routers and blueprints change
nothing. The checks themselves are the core's (one layered check per request).

The Redis key of a decorated route's limit, for the key ``k`` a key function returns:

- a **config policy** by name (``@limits.limit("login")``): ``k`` itself, as the
  middleware's own rule and every other language use it. The policy is the budget: routes
  limited by the same policy share it, and ``limiter.set_override(k, "login", ...)``
  applies to the route.
- a **rate string, Limit or Policy object** (``@limits.limit("5/minute")``): ``<route>:k``,
  one budget per route. ``<route>`` is the function's ``__qualname__`` (not its module:
  ``python app.py`` and ``uvicorn app:app`` share the budget); the n-th distinct function
  decorated under one qualified name (routes made by one factory, two modules' ``login``)
  is ``<qualname>#n`` in decoration order.
- ``scope="name"`` (or :meth:`RouteLimits.shared_limit`) names it yourself: ``name:k``, one
  budget for every route of that scope, stable whatever the code's layout.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar, Union

from ._errors import InvalidArgumentError
from ._http import Layer, PolicyLike, Request, _validate_policy
from ._shardlimit import Limit, Limiter, Policy, ip_key

F = TypeVar("F", bound=Callable[..., object])
#: What a limit decorates: an endpoint function, or a Flask Blueprint.
T = TypeVar("T")
#: Counts a response or not (``deduct_when``): the Flask extension passes the Response,
#: the ASGI middleware the status code.
DeductWhen = Callable[[Any], bool]
#: The key of a request: a str, or None to skip the limit for this request.
KeyFunc = Callable[[Request], Optional[str]]
#: A limit: a policy name, a rate string ("5/minute"), a Policy or a Limit; or a function
#: of the request that returns one (a plan per tenant).
LimitLike = Union[PolicyLike, Callable[[Request], PolicyLike]]
Cost = Union[int, Callable[[Request], int]]


def client_ip_key(request: Request) -> Optional[str]:
    """The default key: the client's address (IPv6 by /64, the core's ``ip_key``)."""
    if request.client_ip is None:
        return None
    try:
        return ip_key(request.client_ip)
    except InvalidArgumentError:
        return request.client_ip


@dataclass(frozen=True)
class RouteLimit:
    limit: LimitLike
    key: Optional[KeyFunc]
    cost: Cost
    #: The key's namespace: the endpoint's name, or the shared scope's.
    scope: Optional[str]
    #: Whether a response counts, for this limit (None: the middleware's ``deduct_when``).
    deduct_when: Optional[DeductWhen] = None


def _is_policy_name(limit: LimitLike) -> bool:
    """A config policy's name (not a rate string): its key is the key function's own."""
    return isinstance(limit, str) and not any(c in limit for c in "/ ;,|")


#: every RouteLimits made, for the start-up checks that look for limits nobody enforces
_ALL_ROUTE_LIMITS: "weakref.WeakSet[RouteLimits]" = weakref.WeakSet()


def limited_by(obj: object) -> list["RouteLimits"]:
    """The RouteLimits objects holding limits on ``obj`` (a view, an endpoint, a Blueprint)."""
    try:
        return [rl for rl in list(_ALL_ROUTE_LIMITS) if obj in rl._limits]
    except TypeError:  # (unhashable: nothing decorated it)
        return []


class RouteLimits:
    """Limits declared on routes with decorators.

    ``key(request) -> str | None`` is the default key (the client address unless given);
    each decorator may give its own. Every limit of a request (stacked decorators, and the
    middleware's own rule) is checked as one layered check: allowed only if all allow, and
    nothing is consumed when one denies.
    """

    def __init__(self, limiter: Limiter, *, key: Optional[KeyFunc] = None) -> None:
        self.limiter = limiter
        self.key: KeyFunc = key or client_ip_key
        self._limits: dict[object, list[RouteLimit]] = {}
        self._exempt: set[object] = set()
        #: each decorated function's route name, and how many carry each qualified name
        self._names: dict[object, str] = {}
        self._qualnames: dict[str, int] = {}
        #: endpoints whose limits relax the middleware's own rule (``override_defaults``)
        self._own_only: set[object] = set()
        #: set once a middleware (``routes=``) or ``FlaskLimits.init_app`` enforces these
        #: limits: a decorated function called before that raises (never unlimited silently)
        self.installed = False
        _ALL_ROUTE_LIMITS.add(self)

    def _validated(self, limit: LimitLike, cost: Cost, key: Optional[KeyFunc] = None,
                   scope: Optional[str] = None, deduct_when: Optional[DeductWhen] = None) -> None:
        if isinstance(limit, str):
            _validate_policy(self.limiter, limit)
        elif not (isinstance(limit, (Policy, Limit)) or callable(limit)):
            raise InvalidArgumentError(
                f"limit: a policy name, a rate string, a Policy, a Limit or a function of the "
                f"request, got {limit!r}")
        if cost is None or isinstance(cost, bool) or (
                not callable(cost) and (not isinstance(cost, int) or cost < 1)):
            raise InvalidArgumentError(f"cost: an int >= 1 or a function of the request, got {cost!r}")
        if key is not None and not callable(key):
            raise InvalidArgumentError(f"key: a function of the request (or None), got {key!r}")
        if scope is not None and (not isinstance(scope, str) or not scope):
            raise InvalidArgumentError(f"scope: a non-empty str (or None), got {scope!r}")
        if deduct_when is not None and not callable(deduct_when):
            raise InvalidArgumentError(f"deduct_when: a function of the response (or None), got {deduct_when!r}")

    def route_name(self, fn: object) -> str:
        """The name a decorated function's route-scoped keys start with: its qualified
        name, ``#n`` for the n-th distinct function decorated under that name."""
        name = self._names.get(fn)
        if name is None:
            qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
            if qual is None and isinstance(getattr(fn, "name", None), str):
                qual = f"{type(fn).__name__}:{getattr(fn, 'name')}"  # a Flask Blueprint
            if qual is None:
                qual = repr(fn)
            n = self._qualnames.get(qual, 0) + 1
            self._qualnames[qual] = n
            name = qual if n == 1 else f"{qual}#{n}"
            self._names[fn] = name
        return name

    def limit(
        self,
        limit: LimitLike,
        *,
        key: Optional[KeyFunc] = None,
        cost: Cost = 1,
        scope: Optional[str] = None,
        deduct_when: Optional[DeductWhen] = None,
        override_defaults: bool = False,
    ) -> Callable[[T], T]:
        """``@limits.limit("5/minute")``: limits the decorated endpoint, per key. Stackable;
        ``cost`` (or ``cost(request)``) units per request; ``limit`` may be a function of
        the request (a plan). ``scope`` shares the budget with every route of that scope
        (see :meth:`shared_limit`; the keys: the module's docstring). ``deduct_when``
        counts only the responses it accepts, for this limit alone (Flask-Limiter's; the
        Flask extension passes the Response, the ASGI middleware the status code).
        ``override_defaults=True``: the middleware's own limit (``policy=``/``rule=``, the
        app-wide default) does not apply to this route, these limits do instead (a route
        that needs a looser limit than the default). An unknown policy name raises here."""
        self._validated(limit, cost, key, scope, deduct_when)

        def decorate(fn: T) -> T:
            rl = RouteLimit(limit, key, cost, scope, deduct_when)
            if getattr(fn, "__shardlimit_routes__", None) is self:
                # stacked on a function this object decorated already
                self._limits[fn].append(rl)
                if override_defaults:
                    self._own_only.update(self._both(fn))
                return fn
            guarded = self._guard(fn)
            entries = self._limits.setdefault(fn, [])
            entries.append(rl)
            self._limits[guarded] = entries
            self._names[guarded] = self.route_name(fn)
            if override_defaults:
                self._own_only.update((fn, guarded))
            return guarded

        return decorate

    @staticmethod
    def _both(fn: object) -> tuple[object, ...]:
        """A guarded function and the one it wraps (the framework may hold either: it
        holds the original when its route decorator ran first)."""
        inner = getattr(fn, "__wrapped__", None)
        return (fn,) if inner is None else (fn, inner)

    def _guard(self, fn: T) -> T:
        """``fn``, raising when called while no middleware enforces these limits (a
        decorator whose RouteLimits was never given to ``RateLimitMiddleware(routes=...)``
        or a FlaskLimits never bound to the app): the route would run unlimited, silently.
        Only plain functions are wrapped (``functools.wraps``: frameworks read the
        original's signature); a class endpoint is recorded as it is."""
        if not inspect.isfunction(fn):
            return fn
        routes = self
        why = (f"{getattr(fn, '__qualname__', fn)} is decorated with route limits that no "
               f"middleware enforces: pass the RouteLimits to RateLimitMiddleware(routes=...) "
               f"(or bind the FlaskLimits with FlaskLimits(limiter, app) or init_app(app))")
        wrapper: Callable[..., Any]
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                if not routes.installed:
                    raise RuntimeError(why)
                return await fn(*args, **kwargs)
        else:
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if not routes.installed:
                    raise RuntimeError(why)
                return fn(*args, **kwargs)
        wrapper.__shardlimit_routes__ = self  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]  # (functools.wraps: the same signature)

    def shared_limit(
        self, limit: LimitLike, scope: str, *, key: Optional[KeyFunc] = None, cost: Cost = 1,
        deduct_when: Optional[DeductWhen] = None,
    ) -> Callable[[T], T]:
        """One budget for every route decorated with the same ``scope`` name."""
        if not isinstance(scope, str) or not scope:
            raise InvalidArgumentError(f"scope: a shared limit needs a scope name, got {scope!r}")
        return self.limit(limit, key=key, cost=cost, scope=scope, deduct_when=deduct_when)

    def exempt(self, fn: F) -> F:
        """``@limits.exempt``: never limited, not even by the middleware's own rule."""
        self._exempt.update(self._both(fn))
        return fn

    def is_exempt(self, endpoint: Optional[object]) -> bool:
        return endpoint is not None and endpoint in self._exempt

    def overrides_defaults(self, endpoint: Optional[object]) -> bool:
        """Whether the endpoint's own limits replace the middleware's rule for it."""
        return endpoint is not None and endpoint in self._own_only

    def layers_for(
        self, endpoint: Optional[object], request: Request
    ) -> list[Layer]:
        """The (key, policy, cost) layers of the endpoint's limits for this request."""
        return [layer for layer, _ in self.layers_with(endpoint, request)]

    def layers_with(
        self, endpoint: Optional[object], request: Request
    ) -> list[tuple[Layer, Optional[DeductWhen]]]:
        """:meth:`layers_for`, each layer with its limit's ``deduct_when``."""
        if endpoint is None:
            return []
        out: list[tuple[Layer, Optional[DeductWhen]]] = []
        for rl in self._limits.get(endpoint, ()):
            key = (rl.key or self.key)(request)
            if key is None:
                continue
            limit = rl.limit
            policy: PolicyLike = limit(request) if callable(limit) else limit
            cost = rl.cost(request) if callable(rl.cost) else rl.cost
            if cost is None or isinstance(cost, bool) or not isinstance(cost, int):
                raise InvalidArgumentError(f"cost: the cost function returned {cost!r}, not an int >= 1")
            if rl.scope is not None:
                key = f"{rl.scope}:{key}"
            elif not _is_policy_name(policy):
                key = f"{self.route_name(endpoint)}:{key}"
            out.append(((key, policy, cost), rl.deduct_when))
        return out
