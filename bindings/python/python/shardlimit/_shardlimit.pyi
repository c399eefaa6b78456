# Type stub of the extension module (bindings/python/src).
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, Literal, Optional, TypedDict, Union, final, overload

from typing_extensions import NotRequired

#: The version of the core and of every binding (the workspace's).
__version__: str
#: Every core error kind as (code, name), in code order.
ERROR_KINDS: list[tuple[int, str]]
#: The kinds that mean "the backend failed" (BackendError subclasses).
BACKEND_ERROR_KINDS: list[str]

class Override(TypedDict):
    """A key's live override (``Limiter.set_override``): ``limit`` is the limit object
    as a config policy writes it, which ``set_override`` takes back."""

    key: str
    policy: str
    limit: dict[str, Any]
    #: Milliseconds left; None for an override until deleted.
    remaining_ms: Optional[int]
    #: Every limit, for an override of several (``limit`` is then the first).
    limits: NotRequired[list[dict[str, Any]]]

class OverridePage(TypedDict):
    """One page of ``Limiter.list_overrides``; ``cursor`` is None on the last page."""

    overrides: list[Override]
    cursor: Optional[str]

#: A policy argument: a policy name of the config, a rate string ("5/minute",
#: "10/second; 100/minute"), a Policy, or a Limit.
PolicyLike = Union[str, "Policy", "Limit"]

class ShadowKey(TypedDict):
    """One key of a shadow report and its shadow-mode denials."""

    key: str
    count: int

class ShadowReport(TypedDict):
    """A policy's shadow-mode denials, summed over every shard: ``total`` counts them
    all, ``keys`` the most-denied keys first, ``untracked`` the denials of keys beyond
    the bound of 1000 keys per policy per shard."""

    policy: str
    total: int
    untracked: int
    keys: list[ShadowKey]

@final
class Decision:
    """The answer to a check. Immutable; ``bool(decision)`` is ``decision.allowed``."""
    @property
    def allowed(self) -> bool:
        """Whether the request may proceed. A denied check consumed nothing."""
    @property
    def limit(self) -> int:
        """The effective limit (units per window, bucket capacity, or max concurrent)."""
    @property
    def remaining(self) -> int:
        """Units still available after this check."""
    @property
    def reset_after(self) -> float:
        """Seconds until the budget is full again with no further traffic."""
    @property
    def retry_after(self) -> Optional[float]:
        """When denied: seconds until the same check would pass; None when allowed or when
        the cost can never fit."""
    @property
    def delay(self) -> float:
        """Leaky bucket: seconds to wait before sending. 0.0 otherwise."""
    @property
    def window(self) -> float:
        """The window the limit is measured over, in seconds."""
    @property
    def policy(self) -> str:
        """The policy that decided (an ad-hoc limit's id)."""
    @property
    def source(self) -> str:
        """Who decided: "redis", "memory", "local", "fallback" (``on_error``
        open/closed: unmeasured, a denial answered 503), "block" or "local_fallback"
        (``on_error: local``: this process's share decided, a denial answered 429)."""
    @property
    def shard(self) -> Optional[int]:
        """The index of the Redis shard that decided, if one did."""
    @property
    def layer(self) -> Optional[int]:
        """Layered checks: the index of the layer this decision describes."""
    @property
    def shadow_denied(self) -> bool:
        """Shadow mode: the limit would have denied, but the policy (or the call,
        ``check_shadow``) is in shadow, so it was allowed and consumed nothing."""
    @property
    def limit_index(self) -> Optional[int]:
        """A multi-limit policy: the index of the limit this decision describes (the one
        that denied, or the tightest). None for a policy of one limit."""
    @property
    def quotas(self) -> list[tuple[int, float]]:
        """A multi-limit policy: every limit in force as (limit, window in seconds), in
        order (what ``RateLimit-Policy`` lists). Empty for a policy of one limit."""
    def headers(self) -> dict[str, str]:
        """The standard rate-limit response headers, in a stable order."""
    def body(self) -> dict[str, Any]:
        """The JSON body of a 429 response, as a dict."""
    def to_dict(self) -> dict[str, Any]:
        """The decision as the CLI prints it (durations in milliseconds)."""
    def to_json(self) -> str:
        """The decision as the CLI prints it, as JSON text."""
    @overload
    def _wire_headers(
        self, x_ratelimit: bool, ietf: bool, now: float, raw: Literal[True]
    ) -> list[tuple[bytes, bytes]]:
        """The headers as the middlewares send them (``shardlimit._http``): the sets asked,
        ``X-RateLimit-Reset`` as the Unix time ``now`` + reset; ``raw``: lower-case byte
        pairs (ASGI), else str pairs."""
    @overload
    def _wire_headers(
        self, x_ratelimit: bool, ietf: bool, now: float, raw: Literal[False]
    ) -> list[tuple[str, str]]:
        """See the other overload."""
    def __bool__(self) -> bool: ...
    def __eq__(self, other: object) -> bool: ...

@final
class Limit:
    """An algorithm with its parameters, validated when built (InvalidArgumentError)."""
    @staticmethod
    def fixed_window(limit: int, window: float) -> Limit:
        """At most ``limit`` units per aligned window of ``window`` seconds."""
    @staticmethod
    def sliding_window(limit: int, window: float) -> Limit:
        """Two-counter estimate of a sliding window of ``window`` seconds."""
    @staticmethod
    def sliding_log(limit: int, window: float) -> Limit:
        """Exact sliding window of ``window`` seconds (one entry per admitted unit)."""
    @staticmethod
    def token_bucket(capacity: int, refill_per_sec: float) -> Limit:
        """Starts full with ``capacity`` tokens and refills ``refill_per_sec`` per second."""
    @staticmethod
    def leaky_bucket(capacity: int, leak_per_sec: float) -> Limit:
        """A shaper: admitted requests are told how long to wait (``Decision.delay``)."""
    @staticmethod
    def concurrency(max: int, lease_ttl: float) -> Limit:
        """At most ``max`` units held at once; leases expire after ``lease_ttl`` seconds."""
    @staticmethod
    def parse(text: str, algorithm: str = "fixed_window") -> Limit:
        """The one limit of a rate string (``"5/minute"``); ``parse_rate`` reads several."""
    @property
    def algorithm(self) -> str:
        """The algorithm's name (``"fixed_window"``, ...)."""
    @property
    def id(self) -> str:
        """The stable identifier used as the policy name of checks against this limit."""

@final
class Policy:
    """A named, validated limit with its failure mode (``on_error``)."""
    def __init__(self, name: str, limit: Limit, on_error: Optional[str] = None) -> None:
        """``on_error``: "open" (default), "closed", "local" or "error"."""
    @property
    def name(self) -> str:
        """The policy's name."""
    @property
    def algorithm(self) -> str:
        """The algorithm's name."""
    @property
    def max(self) -> int:
        """The effective limit (units per window, capacity, or max concurrent)."""
    @property
    def limits(self) -> list[Limit]:
        """Every limit of the policy, in order (one unless it is a multi-limit policy)."""
    @property
    def on_error(self) -> str:
        """What happens when the shard fails: "open", "closed", "local" or "error"."""

@final
class Lease:
    """Held units of a concurrency policy; give them back with ``Limiter.release``."""
    @property
    def key(self) -> str:
        """The key the units are held for."""
    @property
    def policy(self) -> str:
        """The concurrency policy's name."""
    @property
    def id(self) -> str:
        """The lease's unique id."""
    @property
    def units(self) -> int:
        """How many units are held."""
    @property
    def decision(self) -> Decision:
        """The decision that granted this lease."""

@final
class Reservation:
    """Units reserved by ``Limiter.reserve``; settle them once with ``Limiter.settle``."""
    @property
    def key(self) -> str:
        """The key the units were reserved for."""
    @property
    def policy(self) -> str:
        """The policy's name."""
    @property
    def units(self) -> int:
        """How many units were reserved."""
    @property
    def at_us(self) -> int:
        """When they were recorded (µs on the engine's clock): settle gives the unused
        part back to that window."""
    @property
    def decision(self) -> Decision:
        """The decision that reserved the units."""
    @property
    def settled(self) -> bool:
        """True once settled."""

@final
class LeaseContext:
    """``with limiter.lease(...) as lease`` / ``async with``; RateLimitExceeded when denied."""
    def __enter__(self) -> Lease:
        """Acquires the units (RateLimitExceeded when denied)."""
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool:
        """Releases the units."""
    def __aenter__(self) -> Awaitable[Lease]:
        """Acquires the units (RateLimitExceeded when denied)."""
    def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> Awaitable[bool]:
        """Releases the units."""

@final
class BlockInfo:
    """A block-list entry."""
    @property
    def reason(self) -> str:
        """Why the key was blocked."""
    @property
    def remaining(self) -> Optional[float]:
        """Seconds left; None for a permanent block."""

@final
class TrustedProxies:
    """Trusted proxy networks (``10.0.0.0/8``, ``2001:db8::/32``, bare addresses)."""
    def __init__(self, cidrs: Sequence[str] = ...) -> None:
        """Parses the networks once (InvalidArgumentError naming a bad one)."""
    def client_ip(self, peer: str, x_forwarded_for: Optional[str] = None) -> str:
        """The client's address: ``peer`` unless it is a trusted proxy; then
        X-Forwarded-For from the right, up to the first address not trusted."""
    def __contains__(self, ip: str) -> bool:
        """Whether ``ip`` is in a trusted network."""

def client_ip(
    peer: str, x_forwarded_for: Optional[str] = None, trusted_proxies: Sequence[str] = ...
) -> str:
    """The client's address behind proxies (see ``TrustedProxies.client_ip``)."""
def ip_key(ip: str, ipv6_prefix: int = 64) -> str:
    """The rate-limit key of a client address: IPv4 as itself, IPv6 as its network of
    ``ipv6_prefix`` bits (``2001:db8:1:2::/64``)."""
def parse_rate(text: str, algorithm: str = "fixed_window") -> list[Limit]:
    """The limits of a rate string (``"5/minute"``, ``"10 per second"``,
    ``"100/hour; 1000/day"``, ``"3/5 minutes"``), of ``algorithm``, in the order written.
    InvalidArgumentError names the bad part."""

#: One check of a layered check: (key, policy) or (key, policy, cost).
LayerLike = Union[tuple[str, PolicyLike], tuple[str, PolicyLike, int]]

@final
class ManualClock:
    """A clock that moves only when told to (microseconds since the Unix epoch)."""
    def __init__(self, start_us: int = 0) -> None:
        """A clock reading ``start_us``."""
    def set_us(self, us: int) -> None:
        """Sets the time."""
    def advance_us(self, us: int) -> None:
        """Moves the time forward."""
    def now_us(self) -> int:
        """The time."""

@final
class ConfigWatcher:
    """Watches a config file (``Limiter.watch_config``) until stopped."""
    def stop(self) -> None:
        """Stops watching (waits for the polling thread). Idempotent."""
    @property
    def active(self) -> bool:
        """True until stopped."""
    def __enter__(self) -> ConfigWatcher: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

@final
class Limiter:
    """A rate limiter. Thread-safe and fork-safe: create one per process (or before fork).
    The async calls (``a``-prefixed) return coroutines for asyncio."""
    @staticmethod
    def memory(*, clock: Optional[ManualClock] = None) -> Limiter:
        """A limiter on the in-memory engine with no named policies."""
    @staticmethod
    def from_json(
        text: str,
        *,
        clock: Optional[ManualClock] = None,
        transport: Literal["default", "host", "thread"] = "default",
    ) -> Limiter:
        """Parses a JSON config. Does not connect: connections are made on first use.
        ``transport``: how ``acheck`` of one policy reaches Redis. ``"host"``: its bytes
        move on the running asyncio loop itself (one connection per shard and loop, no
        I/O-thread hop); every shard must be a standalone Redis over plain TCP (a
        ConfigError says which is not). ``"thread"``: the limiter's I/O thread.
        ``"default"``: the host transport where it serves the shards, else the I/O thread.
        Sync calls never use the loop. Close the limiter on its loop when done with it."""
    @staticmethod
    def from_config_file(
        path: Union[str, os.PathLike[str]],
        *,
        clock: Optional[ManualClock] = None,
        transport: Literal["default", "host", "thread"] = "default",
    ) -> Limiter:
        """Loads a JSON config file (``transport``: see ``from_json``)."""
    @staticmethod
    def from_config(
        path: Union[str, os.PathLike[str]],
        *,
        clock: Optional[ManualClock] = None,
        transport: Literal["default", "host", "thread"] = "default",
    ) -> Limiter:
        """The same as ``from_config_file`` (its earlier name)."""
    @staticmethod
    def from_env(
        *,
        clock: Optional[ManualClock] = None,
        transport: Literal["default", "host", "thread"] = "default",
    ) -> Limiter:
        """Uses ``$SHARDLIMIT_CONFIG``; the in-memory engine when unset (``transport``:
        see ``from_json``)."""
    @property
    def is_redis(self) -> bool:
        """True when Redis shards decide, False for the in-memory engine."""
    @property
    def transport(self) -> Literal["host", "thread"]:
        """Which transport carries ``acheck`` of one policy: ``"host"`` (the running
        asyncio loop) or ``"thread"`` (the I/O thread; every in-memory limiter)."""
    @property
    def policies(self) -> list[str]:
        """The names of the configured policies."""
    @property
    def _config_generation(self) -> int:
        """Changes whenever the config in force does (a reload, a watched file): what the
        middlewares' caches of policy facts are keyed by."""
    def connect(self, timeout: float = 5.0) -> None:
        """Connects to every shard and loads the scripts within ``timeout`` seconds of its
        own, so that the first checks do not spend their deadline connecting; raises the
        shard's BackendError when one does not answer in time. Nothing to do in memory."""
    def aconnect(self, timeout: float = 5.0) -> Coroutine[Any, Any, None]:
        """``await limiter.aconnect(timeout)``: :meth:`connect` on asyncio."""
    @property
    def memory_keys(self) -> Optional[int]:
        """How many keys the in-memory engine holds; None on Redis."""
    def policy(self, name: str) -> Policy:
        """The named policy of the config (UnknownPolicyError)."""
    def plan_policy(self, plan: str, policy: str) -> Policy:
        """The policy as plan ``plan`` of the config has it (the plan's limits under the
        policy's name, or the policy itself when the plan does not list it): check under a
        plan with ``limiter.check(key, limiter.plan_policy("pro", "api"))``.
        InvalidArgumentError for an unknown plan, UnknownPolicyError for an unknown policy."""
    def route(self, key: str) -> Optional[tuple[int, str]]:
        """The shard ``key`` routes to, as (index, name); None in memory."""
    def check(self, key: str, policy: PolicyLike, cost: int = 1) -> Decision:
        """Checks ``cost`` units of ``policy`` for ``key``; a rate string of several
        limits is one layered check."""
    def check_shadow(self, key: str, policy: PolicyLike, cost: int = 1) -> Decision:
        """``check`` in shadow mode for this call: a would-be denial is allowed
        (``shadow_denied``), consumes nothing and is counted for ``shadow_report``."""
    def shadow_report(self, policy: str, top: Optional[int] = None) -> ShadowReport:
        """Shadow-mode denials of a policy by key, summed over every shard, most first."""
    def peek(self, key: str, policy: PolicyLike) -> Decision:
        """``key``'s state without consuming."""
    def acquire(
        self, key: str, policy: PolicyLike, units: int = 1
    ) -> tuple[Decision, Optional[Lease]]:
        """Acquires ``units`` of a concurrency policy: (decision, lease or None)."""
    def release(self, lease: Lease) -> bool:
        """Releases a lease; False when it was no longer held."""
    def charge(self, key: str, policy: PolicyLike, cost: int = 1) -> Decision:
        """Consumes ``cost`` units without ever denying: the key may go into debt (capped
        at one limit) and later checks are denied until it is repaid. Always allowed."""
    def refund(self, key: str, policy: PolicyLike, cost: int = 1) -> Decision:
        """Gives ``cost`` units back, never above the limit. Always allowed."""
    def reserve(
        self, key: str, policy: PolicyLike, estimate: int = 1
    ) -> tuple[Decision, Optional[Reservation]]:
        """A check of an estimated cost: (decision, reservation or None when denied)."""
    def settle(self, reservation: Reservation, actual: int) -> Decision:
        """Settles a reservation at its actual cost (0 gives it all back): the unused part
        goes back to the window that admitted it, the excess is charged. Once."""
    def reset(self, key: str, policy: PolicyLike) -> None:
        """Forgets ``key``'s state under ``policy``."""
    def lease(self, key: str, policy: PolicyLike, units: int = 1) -> LeaseContext:
        """A context manager holding ``units`` of a concurrency policy."""
    def check_all(self, layers: Iterable[LayerLike]) -> Decision:
        """A layered check: allowed only if every layer allows; when any layer denies,
        no layer consumes."""
    def block(self, key: str, ttl: Optional[float] = None, reason: str = "") -> None:
        """Puts ``key`` on the block list for ``ttl`` seconds (None: until unblocked)."""
    def unblock(self, key: str) -> bool:
        """Removes ``key`` from the block list; True when it was blocked."""
    def blocked(self, key: str) -> Optional[BlockInfo]:
        """The block-list entry of ``key``, or None."""
    def set_override(
        self,
        key: str,
        policy: str,
        limit: Union[str, dict[str, Any]],
        ttl: Optional[float] = None,
    ) -> Override:
        """Sets ``key``'s live override of ``policy`` (a config policy with
        ``"overrides": true``) to ``limit``: a rate string (``"100/minute"``), a limit
        object in JSON or a dict as in a config policy; for ``ttl`` seconds (None: until
        deleted). Every process's next check of the key, in any language, uses it."""
    def get_override(self, key: str, policy: str) -> Optional[Override]:
        """``key``'s override of ``policy``, or None."""
    def list_overrides(
        self, policy: str, cursor: Optional[str] = None, limit: int = 1000
    ) -> OverridePage:
        """One page of ``policy``'s overrides on every shard; pass ``cursor`` back for
        the next (None: the last page)."""
    def delete_override(self, key: str, policy: str) -> bool:
        """Deletes ``key``'s override of ``policy``; True when it had one."""
    def set_log_sink(self, callback: Optional[Callable[[dict[str, Any]], object]]) -> None:
        """Where the warning lines go (every fallback to ``on_error``, a circuit opened, a
        rejected config; at most one per reason and policy or shard per ``log_interval``,
        each with ``suppressed``, how many were not written since the last). By default
        ``logging.getLogger("shardlimit")`` at WARNING, fields in
        ``extra={"shardlimit": {...}}``; a callable gets the record as a dict (``level``,
        ``target``, ``reason``, ``subject``, ``error_kind``, ``error``, ``allowed``,
        ``suppressed``, ``message``) on a thread of its own; None drops them."""
    def subscribe(self, callback: Callable[[dict[str, str]], object]) -> None:
        """Calls ``callback(event)`` for every event (denied, blocked, fallback, circuit,
        shadow_denied, near_limit, reloaded, reload_rejected) on a thread of its own;
        ``event["kind"]`` is the kind (the name every binding uses)."""
    def reload(self, config: Union[str, dict[str, Any]]) -> dict[str, Any]:
        """Applies a new config (JSON text or a dict); returns what changed."""
    def reload_from_file(self, path: Union[str, os.PathLike[str]]) -> dict[str, Any]:
        """``reload`` from a config file."""
    def watch_config(
        self, path: Union[str, os.PathLike[str]], every: float = 1.0
    ) -> ConfigWatcher:
        """Reloads whenever ``path`` changes (polled every ``every`` seconds)."""
    def set_scale(self, factor: float, policies: Sequence[str] = ...) -> None:
        """Scales limits by ``factor`` (0 < factor <= 1): all policies, or the named ones."""
    def scale(self) -> float:
        """The global scale factor in force."""
    def set_latency_scale(self, target: float, min_factor: float = 0.1) -> None:
        """Installs the core's latency hook that ``observe_health`` uses."""
    def observe_health(self, signal: float) -> float:
        """Feeds a health signal to the scale hook; returns the factor now in force."""
    def metrics(self) -> str:
        """The metrics in the Prometheus text format (``metrics()`` in every language)."""
    def metrics_snapshot(self) -> dict[str, Any]:
        """Counters per policy, the Redis latency histogram and dropped events."""
    def prometheus(self) -> str:
        """The same as ``metrics()`` (its earlier name)."""
    def close(self) -> None:
        """Lets the connections and the I/O runtime go once the calls in flight finish;
        later calls raise InvalidArgumentError. Idempotent; also the end of ``with``."""
    @property
    def closed(self) -> bool:
        """True once closed."""
    def __enter__(self) -> Limiter: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
    def acheck(
        self, key: str, policy: PolicyLike, cost: int = 1
    ) -> Coroutine[Any, Any, Decision]:
        """``check`` on asyncio, never blocking the event loop."""
    def apeek(self, key: str, policy: PolicyLike) -> Coroutine[Any, Any, Decision]:
        """``peek`` on asyncio."""
    def acheck_shadow(
        self, key: str, policy: PolicyLike, cost: int = 1
    ) -> Coroutine[Any, Any, Decision]:
        """``check_shadow`` on asyncio."""
    def ashadow_report(
        self, policy: str, top: Optional[int] = None
    ) -> Coroutine[Any, Any, ShadowReport]:
        """``shadow_report`` on asyncio."""
    def aacquire(
        self, key: str, policy: PolicyLike, units: int = 1
    ) -> Coroutine[Any, Any, tuple[Decision, Optional[Lease]]]:
        """``acquire`` on asyncio."""
    def arelease(self, lease: Lease) -> Coroutine[Any, Any, bool]:
        """``release`` on asyncio."""
    def acharge(
        self, key: str, policy: PolicyLike, cost: int = 1
    ) -> Coroutine[Any, Any, Decision]:
        """``charge`` on asyncio."""
    def arefund(
        self, key: str, policy: PolicyLike, cost: int = 1
    ) -> Coroutine[Any, Any, Decision]:
        """``refund`` on asyncio."""
    def areserve(
        self, key: str, policy: PolicyLike, estimate: int = 1
    ) -> Coroutine[Any, Any, tuple[Decision, Optional[Reservation]]]:
        """``reserve`` on asyncio."""
    def asettle(
        self, reservation: Reservation, actual: int
    ) -> Coroutine[Any, Any, Decision]:
        """``settle`` on asyncio."""
    def areset(self, key: str, policy: PolicyLike) -> Coroutine[Any, Any, None]:
        """``reset`` on asyncio."""
    def acheck_all(self, layers: Iterable[LayerLike]) -> Coroutine[Any, Any, Decision]:
        """``check_all`` on asyncio."""
    def ablock(
        self, key: str, ttl: Optional[float] = None, reason: str = ""
    ) -> Coroutine[Any, Any, None]:
        """``block`` on asyncio."""
    def aunblock(self, key: str) -> Coroutine[Any, Any, bool]:
        """``unblock`` on asyncio."""
    def ablocked(self, key: str) -> Coroutine[Any, Any, Optional[BlockInfo]]:
        """``blocked`` on asyncio."""
    def aset_override(
        self,
        key: str,
        policy: str,
        limit: Union[str, dict[str, Any]],
        ttl: Optional[float] = None,
    ) -> Coroutine[Any, Any, Override]:
        """``set_override`` on asyncio."""
    def aget_override(self, key: str, policy: str) -> Coroutine[Any, Any, Optional[Override]]:
        """``get_override`` on asyncio."""
    def alist_overrides(
        self, policy: str, cursor: Optional[str] = None, limit: int = 1000
    ) -> Coroutine[Any, Any, OverridePage]:
        """``list_overrides`` on asyncio."""
    def adelete_override(self, key: str, policy: str) -> Coroutine[Any, Any, bool]:
        """``delete_override`` on asyncio."""
