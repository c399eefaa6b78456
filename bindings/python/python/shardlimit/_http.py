"""What the ASGI and WSGI middlewares share: the request view handed to rules, the rule
types, and turning a rule's answer into a check. No rate-limiting logic lives here: the
core decides, renders the headers and the 429 body."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from ._errors import InvalidArgumentError
from ._shardlimit import Decision, Limit, Limiter, Policy, TrustedProxies, ip_key

PolicyLike = Union[str, Policy, Limit]
#: One check: (key, policy) or (key, policy, cost).
Layer = Union[tuple[str, PolicyLike], tuple[str, PolicyLike, int]]
#: What a rule returns for a request: one check, a list of checks made as one layered check
#: (IP, API key, tenant...: allowed only if all allow, nothing consumed otherwise), or None
#: to let the request through unchecked.
Target = Union[Layer, list[Layer]]
Rule = Callable[["Request"], Optional[Target]]


@dataclass(frozen=True)
class Request:
    """The request as a rule sees it, the same for ASGI and WSGI."""

    method: str
    path: str
    #: Header names in lower case; repeated headers joined with ", ".
    headers: Mapping[str, str]
    #: The TCP peer's address, if the server gave one.
    peer: Optional[str]
    #: The client's address: the peer, or when the peer is a trusted proxy the address that
    #: X-Forwarded-For names (decided by the core's ``client_ip``).
    client_ip: Optional[str]
    #: The ASGI scope or the WSGI environ.
    raw: Any


def by_client_ip(policy: PolicyLike, prefix: str = "ip:", ipv6_prefix: int = 64) -> Rule:
    """A rule limiting every request by client address under ``policy``: IPv6 clients by
    their network of ``ipv6_prefix`` bits (the core's ``ip_key``), so that one client cannot
    rotate through its /64 for fresh budgets."""
    ip_key("::1", ipv6_prefix)  # a bad prefix fails here, not on every request

    def rule(request: Request) -> Optional[Target]:
        if request.client_ip is None:
            return None
        try:
            key = ip_key(request.client_ip, ipv6_prefix)
        except InvalidArgumentError:
            # not an IP address (a Unix socket path, a test client's name): as it is
            key = request.client_ip
        return (prefix + key, policy)

    return rule


class Checker:
    """Runs a rule's answer against the limiter (sync or async)."""

    def __init__(
        self,
        limiter: Limiter,
        rule: Optional[Rule],
        policy: Optional[PolicyLike],
        trusted_proxies: Iterable[str],
    ) -> None:
        if rule is None:
            if policy is None:
                raise TypeError("pass rule= (request -> (key, policy)) or policy=")
            rule = by_client_ip(policy)
        elif policy is not None:
            raise TypeError("pass either rule= or policy=, not both")
        self.limiter = limiter
        self.rule = rule
        self.trusted = TrustedProxies(list(trusted_proxies))

    def client_ip(self, peer: Optional[str], forwarded_for: Optional[str]) -> Optional[str]:
        if peer is None:
            return None
        try:
            return self.trusted.client_ip(peer, forwarded_for)
        except InvalidArgumentError:
            # not an IP address (a Unix socket path, a test client's name): the peer as is
            return peer

    def request(
        self, method: str, path: str, headers: Mapping[str, str], peer: Optional[str], raw: Any
    ) -> Request:
        ip = self.client_ip(peer, headers.get("x-forwarded-for"))
        return Request(method, path, headers, peer, ip, raw)

    def check(self, target: Target) -> Decision:
        if isinstance(target, list):
            return self.limiter.check_all(target)
        return self.limiter.check(*target)

    async def acheck(self, target: Target) -> Decision:
        if isinstance(target, list):
            return await self.limiter.acheck_all(target)
        return await self.limiter.acheck(*target)


def too_many_requests(decision: Decision) -> tuple[list[tuple[str, str]], bytes]:
    """Headers and body of the 429 answer for a denied decision."""
    body = json.dumps(decision.body(), separators=(",", ":")).encode()
    headers = list(decision.headers().items())
    headers.append(("Content-Type", "application/json"))
    headers.append(("Content-Length", str(len(body))))
    return headers, body
