"""Route-level limits, shared by the ASGI middleware and the Flask extension: decorators
that record limits on an endpoint (the function a route calls), looked up after the
framework's own routing has chosen the endpoint, so mounts, routers and blueprints change
nothing. The checks themselves are the core's (one layered check per request)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, TypeVar, Union

from ._errors import InvalidArgumentError
from ._http import Layer, PolicyLike, Request, _validate_policy
from ._shardlimit import Limiter, ip_key

F = TypeVar("F", bound=Callable[..., object])
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


def _name(fn: Callable[..., object]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


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
        self._limits: dict[Callable[..., object], list[RouteLimit]] = {}
        self._exempt: set[Callable[..., object]] = set()

    def _validated(self, limit: LimitLike, cost: Cost) -> None:
        if isinstance(limit, str):
            _validate_policy(self.limiter, limit)
        if isinstance(cost, bool) or (not callable(cost) and (not isinstance(cost, int) or cost < 1)):
            raise InvalidArgumentError(f"cost must be an int >= 1 or a function, got {cost!r}")

    def limit(
        self,
        limit: LimitLike,
        *,
        key: Optional[KeyFunc] = None,
        cost: Cost = 1,
        scope: Optional[str] = None,
    ) -> Callable[[F], F]:
        """``@limits.limit("5/minute")``: limits the decorated endpoint, per key. Stackable;
        ``cost`` (or ``cost(request)``) units per request; ``limit`` may be a function of
        the request (a plan). ``scope`` shares the budget with every route of that scope
        (see :meth:`shared_limit`). An unknown policy name raises here."""
        self._validated(limit, cost)

        def decorate(fn: F) -> F:
            self._limits.setdefault(fn, []).append(RouteLimit(limit, key, cost, scope))
            return fn

        return decorate

    def shared_limit(
        self, limit: LimitLike, scope: str, *, key: Optional[KeyFunc] = None, cost: Cost = 1
    ) -> Callable[[F], F]:
        """One budget for every route decorated with the same ``scope`` name."""
        if not scope:
            raise InvalidArgumentError("a shared limit needs a scope name")
        return self.limit(limit, key=key, cost=cost, scope=scope)

    def exempt(self, fn: F) -> F:
        """``@limits.exempt``: never limited, not even by the middleware's own rule."""
        self._exempt.add(fn)
        return fn

    def is_exempt(self, endpoint: Optional[Callable[..., object]]) -> bool:
        return endpoint is not None and endpoint in self._exempt

    def layers_for(
        self, endpoint: Optional[Callable[..., object]], request: Request
    ) -> list[Layer]:
        """The (key, policy, cost) layers of the endpoint's limits for this request."""
        if endpoint is None:
            return []
        out: list[Layer] = []
        for rl in self._limits.get(endpoint, ()):
            key = (rl.key or self.key)(request)
            if key is None:
                continue
            limit = rl.limit
            policy: PolicyLike = limit(request) if callable(limit) else limit
            cost = rl.cost(request) if callable(rl.cost) else rl.cost
            scope = rl.scope if rl.scope is not None else _name(endpoint)
            out.append((f"{scope}:{key}", policy, cost))
        return out
