"""The exception hierarchy, one class per core ``ErrorKind`` (``ERROR_KINDS``).

The extension raises these through :func:`_from_core`; ``kind`` and ``code`` are the core's
stable kind name and number, the message is the core's own. The tree follows
``spec/errors.json`` (``UnknownPolicyError`` is an ``InvalidArgumentError``; code 6 is
retired). No class derives from ``OSError``: servers such as gunicorn take an ``OSError``
escaping a request for a dead client socket and send no response at all.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, ClassVar, Optional

if TYPE_CHECKING:
    from ._shardlimit import Decision

__all__ = [
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


class Error(Exception):
    """Base class of every error shardlimit raises.

    ``kind`` is the core's stable kind name (``"config"``, ``"timeout"``, ...) and ``code``
    its stable number: branch on the class, or on these, never on the message.
    """

    kind: ClassVar[str] = ""
    code: ClassVar[int] = 0


class ConfigError(Error, builtins.ValueError):
    """The configuration is invalid; the message names the field (``policies.login.window``)."""

    kind = "config"
    code = 1


class ConfigFileError(Error):
    """The configuration file could not be read (not an ``OSError``: see the module)."""

    kind = "io"
    code = 8


class InvalidArgumentError(Error, builtins.ValueError):
    """An argument of a call is invalid (empty or too long key, cost below 1, ...)."""

    kind = "invalid_argument"
    code = 2


class UnknownPolicyError(InvalidArgumentError):
    """A policy name that the configuration does not define."""

    kind = "unknown_policy"
    code = 7


class BackendError(Error):
    """Redis failed rather than the caller: the errors a policy's ``on_error`` applies to."""


class ConnectionError(BackendError):
    """A Redis shard could not be reached, or the connection broke."""

    kind = "connection"
    code = 3


class TimeoutError(BackendError):
    """A Redis shard did not answer within the configured deadline (``timeout_ms``)."""

    kind = "timeout"
    code = 4


class ScriptError(BackendError):
    """Redis answered with an error while running a script or command."""

    kind = "script"
    code = 5


class UnavailableError(BackendError):
    """A shard's circuit breaker is open after repeated failures: it is skipped, at no cost
    per call, until a background probe sees it answer again."""

    kind = "unavailable"
    code = 10


class OverloadedError(Error):
    """More checks wait for a shard's connection in this process than its queue holds
    (``max_queue``): the check was refused, neither admitted nor sent to ``on_error``.
    The shard is fine; this process sends more than it answers."""

    kind = "overloaded"
    code = 11


class InternalError(Error):
    """A bug in shardlimit: an invariant was broken. Please report it."""

    kind = "internal"
    code = 9


class RateLimitExceeded(Exception):
    """Raised by ``with limiter.lease(...)`` when the lease is denied. Not an :class:`Error`:
    the limiter worked, the limit said no. ``decision`` tells why and for how long."""

    decision: Decision

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.body()["message"])
        self.decision = decision

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds until the same request could pass, or None when it never can."""
        return self.decision.retry_after


#: Every concrete error class by core kind name.
ERRORS_BY_KIND: dict[str, type[Error]] = {
    cls.kind: cls
    for cls in (
        ConfigError,
        InvalidArgumentError,
        ConnectionError,
        TimeoutError,
        ScriptError,
        UnknownPolicyError,
        ConfigFileError,
        InternalError,
        UnavailableError,
        OverloadedError,
    )
}


class _UnmappedError(Error):
    """A kind added to the core after this table (the table test catches that)."""


def _from_core(kind: str, code: int, message: str) -> Error:
    cls = ERRORS_BY_KIND.get(kind)
    if cls is not None:
        return cls(message)
    err = _UnmappedError(message)
    err.kind = kind  # type: ignore[misc]
    err.code = code  # type: ignore[misc]
    return err
