"""shardlimit: distributed rate limiting as a library.

One Rust core (algorithms, Redis scripts, shard routing) shared by every language, so that
Python, Node, Go and Rust services on one Redis and one config enforce the same limits.

    >>> import shardlimit
    >>> limiter = shardlimit.Limiter.memory()
    >>> login = shardlimit.Limit.fixed_window(5, window=60)
    >>> d = limiter.check("user:42", login)
    >>> bool(d), d.remaining
    (True, 4)

Middleware: :mod:`shardlimit.asgi` (Starlette, FastAPI) and :mod:`shardlimit.wsgi` (Flask).
"""

from ._errors import (
    BackendError,
    ConfigError,
    ConfigFileError,
    ConnectionError,
    Error,
    InternalError,
    InvalidArgumentError,
    RateLimitExceeded,
    RoutingError,
    ScriptError,
    TimeoutError,
    UnavailableError,
    UnknownPolicyError,
)
from ._shardlimit import (
    BlockInfo,
    Decision,
    Lease,
    LeaseContext,
    Limit,
    Limiter,
    ManualClock,
    Policy,
    TrustedProxies,
    __version__,
    client_ip,
    ip_key,
)

__all__ = [
    "__version__",
    "Limiter",
    "Limit",
    "Policy",
    "Decision",
    "Lease",
    "LeaseContext",
    "ManualClock",
    "BlockInfo",
    "TrustedProxies",
    "client_ip",
    "ip_key",
    "Error",
    "ConfigError",
    "ConfigFileError",
    "InvalidArgumentError",
    "UnknownPolicyError",
    "BackendError",
    "ConnectionError",
    "TimeoutError",
    "ScriptError",
    "UnavailableError",
    "RoutingError",
    "InternalError",
    "RateLimitExceeded",
]
