"""What the ASGI and WSGI middlewares share: the request view handed to rules, the rule
types, and turning a rule's answer into a check. No rate-limiting logic lives here: the
core decides, renders the headers and the 429 body."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Callable, Optional, Union

from ._errors import BackendError, InvalidArgumentError
from ._shardlimit import (
    Decision,
    Lease,
    Limit,
    Limiter,
    Policy,
    Reservation,
    TrustedProxies,
    ip_key,
    parse_rate,
)

PolicyLike = Union[str, Policy, Limit]
#: One check: (key, policy) or (key, policy, cost).
Layer = Union[tuple[str, PolicyLike], tuple[str, PolicyLike, int]]
#: What a rule returns for a request: one check, a list of checks made as one layered check
#: (IP, API key, tenant...: allowed only if all allow, nothing consumed otherwise), or None
#: to let the request through unchecked.
Target = Union[Layer, list[Layer]]
Rule = Callable[["Request"], Optional[Target]]
#: What a request whose units may be given back holds: its reservation, the layers of its
#: layered check, or None (denied, or nothing to give back).
Counted = Union[Reservation, list[Layer], None]

log = logging.getLogger("shardlimit")


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


class LazyHeaders(Mapping[str, str]):
    """A request's headers (``make(source)``: names in lower case), made on first use:
    most rules read none, or one, and a dict per request costs every request."""

    __slots__ = ("_make", "_source", "_dict")

    def __init__(self, make: Callable[[Any], dict[str, str]], source: Any) -> None:
        self._make = make
        self._source = source
        self._dict: Optional[dict[str, str]] = None

    def _all(self) -> dict[str, str]:
        if self._dict is None:
            self._dict = self._make(self._source)
        return self._dict

    def __getitem__(self, name: str) -> str:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


def by_client_ip(policy: PolicyLike, prefix: str = "ip:", ipv6_prefix: int = 64) -> Rule:
    """A rule limiting every request by client address under ``policy``: IPv6 clients by
    their network of ``ipv6_prefix`` bits (the core's ``ip_key``), so that one client cannot
    rotate through its /64 for fresh budgets."""
    ip_key("::1", ipv6_prefix)  # a bad prefix fails here, not on every request

    def rule(request: Request) -> Optional[Target]:
        if request.client_ip is None:
            return None
        return (prefix + _ip_key(request.client_ip, ipv6_prefix), policy)

    # what the middlewares' fast path needs to apply this rule without building a Request
    rule._shardlimit_by_ip = (prefix, policy, ipv6_prefix)  # type: ignore[attr-defined]
    return rule


def _ip_key(client_ip: str, ipv6_prefix: int) -> str:
    try:
        return ip_key(client_ip, ipv6_prefix)
    except InvalidArgumentError:
        # not an IP address (a Unix socket path, a test client's name): as it is
        return client_ip


#: How many client addresses a middleware remembers the key of.
IP_CACHE = 4096


def _no_rule(request: Request) -> Optional[Target]:
    return None


def _validate_policy(limiter: Limiter, policy: str) -> None:
    """An unknown policy name or a bad rate string fails when the middleware or decorator
    is built, not with a 500 on every request."""
    if any(c in policy for c in "/ ;,|"):
        parse_rate(policy)
    else:
        limiter.policy(policy)


class Checker:
    """Runs a rule's answer against the limiter (sync or async)."""

    def __init__(
        self,
        limiter: Limiter,
        rule: Optional[Rule],
        policy: Optional[PolicyLike],
        trusted_proxies: Iterable[str],
        routes: bool = False,
    ) -> None:
        if rule is None:
            if policy is None:
                if not routes:
                    raise TypeError("pass rule= (request -> (key, policy)), policy= or routes=")
                rule = _no_rule
            else:
                if isinstance(policy, str):
                    _validate_policy(limiter, policy)
                rule = by_client_ip(policy)
        elif policy is not None:
            raise TypeError("pass either rule= or policy=, not both")
        self.limiter = limiter
        self.rule = rule
        proxies = list(trusted_proxies)
        self.trusted = TrustedProxies(proxies)
        #: whether X-Forwarded-For is read at all (only a trusted proxy's is believed)
        self.reads_forwarded_for = bool(proxies)
        #: the built-in rule of ``policy=`` (by_client_ip): (prefix, policy, ipv6_prefix),
        #: applied by :meth:`ip_target` without a Request
        self.by_ip: Optional[tuple[str, PolicyLike, int]] = getattr(rule, "_shardlimit_by_ip", None)
        #: (peer, X-Forwarded-For) -> the key of the built-in rule (None: no address)
        self._ip_keys: dict[tuple[Optional[str], Optional[str]], Optional[str]] = {}
        #: policy name (or rate string) -> whether it is a concurrency policy, for the
        #: config of generation ``_generation`` (a reload may change a policy's algorithm)
        self._concurrency: dict[str, bool] = {}
        self._generation = -1

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
        # (X-Forwarded-For only matters when a proxy is trusted: then it is read)
        forwarded_for = headers.get("x-forwarded-for") if self.reads_forwarded_for else None
        return Request(method, path, headers, peer, self.client_ip(peer, forwarded_for), raw)

    def ip_target(self, peer: Optional[str], forwarded_for: Optional[str]) -> Optional[Layer]:
        """The built-in rule's check (:attr:`by_ip`) for a request from ``peer``: what the
        rule returns for the Request, without building one; keys remembered per address."""
        assert self.by_ip is not None
        prefix, policy, ipv6_prefix = self.by_ip
        cache_key = (peer, forwarded_for if self.reads_forwarded_for else None)
        try:
            key = self._ip_keys[cache_key]
        except KeyError:
            ip = self.client_ip(peer, cache_key[1])
            key = None if ip is None else prefix + _ip_key(ip, ipv6_prefix)
            if len(self._ip_keys) >= IP_CACHE:
                self._ip_keys.clear()  # bounded: addresses are the clients' to choose
            self._ip_keys[cache_key] = key
        return None if key is None else (key, policy)

    def reserve(self, target: Target) -> tuple[Decision, Counted]:
        """A check whose units can be given back once the response is known (``deduct_when``):
        one check reserves them (one layered check, when several); :meth:`give_back` returns
        them. A denial holds nothing."""
        if isinstance(target, list):
            d = hold(self.limiter.check_all(target))
            return d, (list(target) if d.allowed else None)
        d, r = self.limiter.reserve(*target)
        return hold(d), r

    async def areserve(self, target: Target) -> tuple[Decision, Counted]:
        """:meth:`reserve` on asyncio."""
        if isinstance(target, list):
            d = await ahold(await self.limiter.acheck_all(target))
            return d, (list(target) if d.allowed else None)
        d, r = await self.limiter.areserve(*target)
        return await ahold(d), r

    def give_back(self, counted: Counted) -> None:
        """Returns what :meth:`reserve` took: the reservation is settled at 0 (its units go
        back to the window that admitted them); a layered check's layers are refunded."""
        if counted is None:
            return
        if isinstance(counted, Reservation):
            self.limiter.settle(counted, 0)
            return
        for layer in counted:
            self.limiter.refund(*layer)

    async def agive_back(self, counted: Counted) -> None:
        """:meth:`give_back` on asyncio."""
        if counted is None:
            return
        if isinstance(counted, Reservation):
            await self.limiter.asettle(counted, 0)
            return
        for layer in counted:
            await self.limiter.arefund(*layer)

    def check(self, target: Target) -> Decision:
        if isinstance(target, list):
            return hold(self.limiter.check_all(target))
        return hold(self.limiter.check(*target))

    async def acheck(self, target: Target) -> Decision:
        if isinstance(target, list):
            return await ahold(await self.limiter.acheck_all(target))
        return await ahold(await self.limiter.acheck(*target))

    # Concurrency policies: a layered check cannot take their units (no lease would give
    # them back), so a request acquires a lease of each and releases it when its response
    # ends; the other layers are checked (or reserved) together as before.

    def is_concurrency(self, policy: PolicyLike) -> bool:
        """Whether a layer's policy is a concurrency policy (a rate string never is)."""
        if isinstance(policy, str):
            generation = self.limiter._config_generation
            if generation != self._generation:
                # another config is in force: what was learnt of its policies may be wrong
                self._concurrency.clear()
                self._generation = generation
            known = self._concurrency.get(policy)
            if known is not None:
                return known
            # a rate string never is; a name is looked up once (a pyo3 call per request
            # would cost every check)
            known = not any(c in policy for c in "/ ;,|") and \
                self.limiter.policy(policy).algorithm == "concurrency"
            if len(self._concurrency) >= 4096:
                self._concurrency.clear()  # bounded: a rule may build rate strings
            self._concurrency[policy] = known
            return known
        return policy.algorithm == "concurrency"

    def split(self, target: Target) -> tuple[Optional[Target], list[Layer]]:
        """The layers checked together (None: none) and the concurrency layers."""
        if not isinstance(target, list):
            return (None, [target]) if self.is_concurrency(target[1]) else (target, [])
        flags = [self.is_concurrency(layer[1]) for layer in target]
        if not any(flags):
            return target, []
        rest = [layer for layer, c in zip(target, flags) if not c]
        leased = [layer for layer, c in zip(target, flags) if c]
        return (rest if len(rest) > 1 else rest[0] if rest else None), leased

    def uncounted(self, target: Target, counted: Counted,
                  deducts: list[tuple[Layer, Optional[Callable[[Any], bool]]]],
                  answer: Any) -> Counted:
        """What of ``counted`` (from :meth:`enter` with ``reserve``) to give back for the
        response ``answer``: the layers whose own ``deduct_when`` (paired with each layer
        of ``target`` in ``deducts``) does not accept it; a layer without one counts."""
        if counted is None:
            return None
        if isinstance(counted, Reservation):
            # the reservation of the one layer that is not a concurrency policy's
            rest, _ = self.split(target)
            for layer, when in deducts:
                if layer == rest:
                    return counted if when is not None and not when(answer) else None
            return None
        pending = list(deducts)
        back: list[Layer] = []
        for layer in counted:
            for i, (candidate, when) in enumerate(pending):
                if candidate == layer:
                    del pending[i]
                    if when is not None and not when(answer):
                        back.append(layer)
                    break
        return back or None

    def enter(self, target: Target, reserve: bool = False) -> tuple[Decision, Counted, list[Lease]]:
        """Admits a request: a lease of each concurrency layer, then a check (``reserve``:
        a reservation, see :meth:`reserve`) of the others. A denial holds nothing: leases
        already acquired are released. Returns the decision, what may be given back, and
        the leases to :meth:`leave` with when the response ends."""
        rest, leased = self.split(target)
        if not leased:
            if reserve:
                d, counted = self.reserve(target)
                return d, counted, []
            return self.check(target), None, []
        d, leases = self._acquire(leased)
        if not d.allowed or rest is None:
            return d, None, leases
        try:
            if reserve:
                rd, counted = self.reserve(rest)
            else:
                rd, counted = self.check(rest), None
        except BaseException:
            self.leave(leases)
            raise
        if not rd.allowed:
            self.leave(leases)
            return rd, None, []
        return rd, counted, leases

    async def aenter(
        self, target: Target, reserve: bool = False
    ) -> tuple[Decision, Counted, list[Lease]]:
        """:meth:`enter` on asyncio."""
        rest, leased = self.split(target)
        if not leased:
            if reserve:
                d, counted = await self.areserve(target)
                return d, counted, []
            if isinstance(target, list):
                d = await self.limiter.acheck_all(target)
            else:
                d = await self.limiter.acheck(*target)
            if d.allowed and d.delay > 0:
                await asyncio.sleep(d.delay)  # (ahold, inline: one coroutine less)
            return d, None, []
        d, leases = await self._aacquire(leased)
        if not d.allowed or rest is None:
            return d, None, leases
        try:
            if reserve:
                rd, counted = await self.areserve(rest)
            else:
                rd, counted = await self.acheck(rest), None
        except BaseException:
            await self.aleave(leases)
            raise
        if not rd.allowed:
            await self.aleave(leases)
            return rd, None, []
        return rd, counted, leases

    def _acquire(self, leased: list[Layer]) -> tuple[Decision, list[Lease]]:
        """A lease of each layer; on a denial (or an error) the ones taken are released.
        The decision is the denial, else the tightest grant."""
        leases: list[Lease] = []
        best: Optional[Decision] = None
        try:
            for layer in leased:
                d, lease = self.limiter.acquire(*layer)
                if not d.allowed:
                    self.leave(leases)
                    return d, []
                if lease is not None:
                    leases.append(lease)
                if best is None or d.remaining < best.remaining:
                    best = d
        except BaseException:
            self.leave(leases)
            raise
        assert best is not None
        return best, leases

    async def _aacquire(self, leased: list[Layer]) -> tuple[Decision, list[Lease]]:
        """:meth:`_acquire` on asyncio."""
        leases: list[Lease] = []
        best: Optional[Decision] = None
        try:
            for layer in leased:
                d, lease = await self.limiter.aacquire(*layer)
                if not d.allowed:
                    await self.aleave(leases)
                    return d, []
                if lease is not None:
                    leases.append(lease)
                if best is None or d.remaining < best.remaining:
                    best = d
        except BaseException:
            await self.aleave(leases)
            raise
        assert best is not None
        return best, leases

    def leave(self, leases: list[Lease]) -> None:
        """Releases a request's leases (its response ended, or it was denied). A failure
        is logged: the lease then expires after its ``lease_ttl``."""
        for lease in leases:
            try:
                self.limiter.release(lease)
            except Exception:
                log.warning("shardlimit: releasing a lease failed; it expires after its "
                            "lease_ttl", exc_info=True)

    async def aleave(self, leases: list[Lease]) -> None:
        """:meth:`leave` on asyncio. The release runs in a task of its own, so that a
        cancelled request (client disconnect, a cancel scope) still releases."""
        if not leases:
            return
        task = asyncio.ensure_future(self._arelease(leases))
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)
        await asyncio.shield(task)

    async def _arelease(self, leases: list[Lease]) -> None:
        for lease in leases:
            try:
                await self.limiter.arelease(lease)
            except Exception:
                log.warning("shardlimit: releasing a lease failed; it expires after its "
                            "lease_ttl", exc_info=True)


#: Releases under way (a task must be referenced until it ends).
_RELEASING: set[asyncio.Future[None]] = set()


def hold(decision: Decision) -> Decision:
    """A shaper (leaky bucket) admitted the request for later (``decision.delay`` seconds):
    the request waits until then, as Node's and tower's middlewares hold it."""
    if decision.allowed and decision.delay > 0:
        time.sleep(decision.delay)
    return decision


async def ahold(decision: Decision) -> Decision:
    """:func:`hold` on asyncio (the event loop keeps serving other requests meanwhile)."""
    if decision.allowed and decision.delay > 0:
        await asyncio.sleep(decision.delay)
    return decision


def layers(target: Optional[Target]) -> list[Layer]:
    """A rule's answer as a list of layers."""
    if target is None:
        return []
    return list(target) if isinstance(target, list) else [target]


HEADER_SETS = ("both", "x-ratelimit", "ietf", "none")
RETRY_AFTER_FORMATS = ("seconds", "http-date")


@dataclass(frozen=True)
class Options:
    """How a middleware answers: which headers, and the status of a denial.

    ``headers``: ``"both"`` (default), ``"x-ratelimit"`` (``X-RateLimit-*``, with
    ``X-RateLimit-Reset`` a Unix timestamp as GitHub and Stripe send it), ``"ietf"``
    (``RateLimit`` and ``RateLimit-Policy``, delta seconds) or ``"none"``.
    ``retry_after``: ``"seconds"`` or ``"http-date"``. ``outage_retry_after``: the
    ``Retry-After`` seconds of a 503, sent when a fallback denies (``on_error: closed``, an
    open circuit): the client did nothing wrong, so it is not told it was rate limited.
    """

    headers: str = "both"
    retry_after: str = "seconds"
    outage_retry_after: int = 1

    @property
    def x_ratelimit(self) -> bool:
        """Whether the ``X-RateLimit-*`` headers are sent."""
        return self.headers in ("both", "x-ratelimit")

    @property
    def ietf(self) -> bool:
        """Whether the IETF ``RateLimit`` and ``RateLimit-Policy`` fields are sent."""
        return self.headers in ("both", "ietf")

    def __post_init__(self) -> None:
        if self.headers not in HEADER_SETS:
            raise InvalidArgumentError(f"headers must be one of {HEADER_SETS}, got {self.headers!r}")
        if self.retry_after not in RETRY_AFTER_FORMATS:
            raise InvalidArgumentError(
                f"retry_after must be one of {RETRY_AFTER_FORMATS}, got {self.retry_after!r}"
            )
        if isinstance(self.outage_retry_after, bool) or not isinstance(self.outage_retry_after, int) \
                or self.outage_retry_after < 0:
            raise InvalidArgumentError(
                f"outage_retry_after must be whole seconds >= 0, got {self.outage_retry_after!r}"
            )


def is_outage(decision: Decision) -> bool:
    """A denial by a fallback (the limit could not be checked), answered with 503."""
    return not decision.allowed and decision.source == "fallback"


def rate_headers(decision: Decision, options: Options, now: Optional[float] = None) -> list[tuple[str, str]]:
    """The decision's headers as ``options`` ask, ``X-RateLimit-Reset`` as a Unix time."""
    now = time.time() if now is None else now
    out = decision._wire_headers(options.x_ratelimit, options.ietf, now, False)
    if decision.allowed:
        return out  # (no Retry-After on an allowance)
    outage = is_outage(decision)
    for i, (name, value) in enumerate(out):
        if name == "Retry-After":
            if outage:
                value = str(options.outage_retry_after)
            if options.retry_after == "http-date":
                value = formatdate(now + int(value), usegmt=True)
            out[i] = (name, value)
            break
    else:
        if outage:
            value = str(options.outage_retry_after)
            if options.retry_after == "http-date":
                value = formatdate(now + options.outage_retry_after, usegmt=True)
            out.append(("Retry-After", value))
    return out


def raw_rate_headers(decision: Decision, options: Options) -> list[tuple[bytes, bytes]]:
    """:func:`rate_headers` as ASGI sends them: lower-case names, bytes."""
    if decision.allowed:
        return decision._wire_headers(options.x_ratelimit, options.ietf, time.time(), True)
    return [(k.lower().encode(), v.encode()) for k, v in rate_headers(decision, options)]


_RAW_IETF = (b"ratelimit", b"ratelimit-policy", b"retry-after")


def has_raw_rate_headers(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """:func:`has_rate_headers` of ASGI's (name, value) byte pairs."""
    for name, _ in headers:
        low = name.lower()
        if low.startswith(b"x-ratelimit-") or low in _RAW_IETF:
            return True
    return False


_RATE_NAMES = frozenset(("ratelimit", "ratelimit-policy", "retry-after"))


def has_rate_headers(names: Iterable[str]) -> bool:
    """Whether a response already carries rate-limit headers (or its own ``Retry-After``):
    then the middleware adds none, so that no response has two sets."""
    for name in names:
        low = name.lower()
        if low.startswith("x-ratelimit-") or low in _RATE_NAMES:
            return True
    return False


def has_rate_header_pairs(headers: Iterable[tuple[str, str]]) -> bool:
    """:func:`has_rate_headers` of WSGI's (name, value) pairs."""
    for name, _ in headers:
        low = name.lower()
        if low.startswith("x-ratelimit-") or low in _RATE_NAMES:
            return True
    return False


def denial(decision: Decision, options: Options) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and JSON body of the answer to a denied decision: 429 when the limit
    said no, 503 when the limit could not be checked."""
    if is_outage(decision):
        # the core's body, as every middleware answers (tower, Node, Go): only the error
        # differs, the client is not told it was rate limited
        status = 503
        payload: dict[str, Any] = decision.body()
        payload["error"] = "rate_limit_unavailable"
    else:
        status = 429
        payload = decision.body()
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = rate_headers(decision, options)
    headers.append(("Content-Type", "application/json"))
    headers.append(("Content-Length", str(len(body))))
    return status, headers, body


STATUS_LINES = {429: "429 Too Many Requests", 503: "503 Service Unavailable"}


def too_many_requests(decision: Decision) -> tuple[list[tuple[str, str]], bytes]:
    """Headers and body of the 429 answer for a denied decision (default options)."""
    _, headers, body = denial(decision, Options())
    return headers, body


def warm_up(limiter: Limiter, timeout: float) -> Optional[str]:
    """Connects to every shard and loads the scripts before traffic arrives
    (:meth:`Limiter.connect`, ``timeout`` seconds of its own), so that the first requests
    do not spend their per-call deadline on a TCP connect and fall back. Returns None when
    every shard answered, else what failed (which the middleware logs as a warning)."""
    if not limiter.is_redis or timeout <= 0:
        return None
    try:
        limiter.connect(timeout)
    except BackendError as e:
        return str(e)
    return None


async def awarm_up(limiter: Limiter, timeout: float) -> Optional[str]:
    """:func:`warm_up` on asyncio."""
    if not limiter.is_redis or timeout <= 0:
        return None
    try:
        await limiter.aconnect(timeout)
    except BackendError as e:
        return str(e)
    return None
