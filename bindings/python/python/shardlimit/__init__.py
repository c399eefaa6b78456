"""shardlimit: distributed rate limiting as a library.

One Rust core (algorithms, Redis scripts, shard routing) shared by every language, so that
Python, Node, Go and Rust services on one Redis and one config enforce the same limits.

    >>> import shardlimit
    >>> limiter = shardlimit.Limiter.memory()
    >>> login = shardlimit.Limit.fixed_window(5, window=60)
    >>> d = limiter.check("user:42", login)
    >>> bool(d), d.remaining
    (True, 4)

Route limits and middleware: :mod:`shardlimit.asgi` (Starlette, FastAPI),
:mod:`shardlimit.flask` (Flask) and :mod:`shardlimit.wsgi` (any WSGI app).
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
    ScriptError,
    TimeoutError,
    UnavailableError,
    OverloadedError,
    UnknownPolicyError,
)
from ._shardlimit import (
    BlockInfo,
    ConfigWatcher,
    Decision,
    Lease,
    LeaseContext,
    Limit,
    Limiter,
    ManualClock,
    Policy,
    Reservation,
    TrustedProxies,
    __version__,
    client_ip,
    ip_key,
    parse_rate,
)

__all__ = [
    "__version__",
    "Limiter",
    "Limit",
    "Policy",
    "Decision",
    "Lease",
    "LeaseContext",
    "Reservation",
    "ManualClock",
    "BlockInfo",
    "TrustedProxies",
    "client_ip",
    "ip_key",
    "parse_rate",
    "ConfigWatcher",
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
    "OverloadedError",
    "InternalError",
    "RateLimitExceeded",
]
