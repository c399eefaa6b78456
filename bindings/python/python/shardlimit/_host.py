"""The host transport (``transport="host"``): ``acheck``'s bytes move on this asyncio
loop, one :class:`asyncio.Protocol` per shard, instead of crossing to the limiter's I/O
thread and back through a wake-up socket.

The core's state machine (``_HostChecks`` over ``shardlimit::HostChecks``) builds the
script calls, packs a loop iteration's checks into one batch call, frames and checks
every reply, keeps the deadlines and decides (``on_error``, metrics, events, circuits),
and resolves each check's future in the same call that hands it the reply's bytes. This
file only moves bytes: it connects (and reconnects with backoff, or at once when a check
finds the shard's circuit closed), writes what ``flush`` gives once per burst
(``loop.call_soon``), hands every chunk read to ``on_data``, and keeps one timer for the
next deadline.

A deadline is a shard's silence, never this loop's business: a loop busy with thousands
of tasks runs the timer late, possibly with the replies it waits for already in the
socket (uvloop even runs timers before it polls). Before the deadlines are looked at, the
sockets are asked how many bytes they hold (``FIONREAD``): a shard whose socket holds
any is not silent, and the timer waits for the loop to read them (``call_soon``).
"""

from __future__ import annotations

import asyncio
import random
import struct
from typing import Any, Optional

try:
    import fcntl
    import termios

    _FIONREAD: Optional[int] = termios.FIONREAD
except ImportError:  # (Windows: the timer defers one loop iteration instead)
    _FIONREAD = None

BACKOFF_MIN = 0.02
# as the core's circuit probe (250 ms): a shard back from a restart is connected again
# within it, or sooner when a check comes once its circuit has closed
BACKOFF_MAX = 0.25


def _unread(transport: Optional[asyncio.BaseTransport]) -> bool:
    """True when the socket under ``transport`` holds bytes this loop has not read."""
    if transport is None or _FIONREAD is None:
        return False
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        n = struct.unpack("i", fcntl.ioctl(sock.fileno(), _FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return False
    return bool(n > 0)


class _Shard(asyncio.Protocol):
    """The socket of one shard: every event goes to the driver."""

    __slots__ = ("driver", "shard", "attempt", "transport")

    def __init__(self, driver: HostTransport, shard: int,
                 attempt: Optional[asyncio.Task[Any]]) -> None:
        self.driver = driver
        self.shard = shard
        self.attempt = attempt  # the connect that made it
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.driver._made(self)

    def data_received(self, data: bytes) -> None:
        self.driver._data(self, data)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.driver._lost(self, exc)


class HostTransport:
    """One limiter's sockets on one event loop (made by the limiter on the first
    ``acheck`` awaited on that loop)."""

    def __init__(self, native: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._native = native
        self._loop = loop
        n = native.shard_count
        self._shards: list[Optional[_Shard]] = [None] * n
        self._connects: list[Optional[asyncio.Task[Any]]] = [None] * n
        self._backoff = [0.0] * n
        self._reconnects: list[Optional[asyncio.TimerHandle]] = [None] * n
        self._timer: Optional[asyncio.TimerHandle] = None
        self._deferred: Optional[asyncio.Handle] = None  # the timer, waiting for a read
        self._closed = False
        native._bind(self._flush, self._connect_now)
        for shard in range(n):
            self._connect(shard)

    def _flush(self) -> None:
        self._arm(self._native.flush())

    def _arm(self, delay: Optional[float]) -> None:
        """One timer for the earliest deadline, while anything waits."""
        if self._timer is None and self._deferred is None and delay is not None \
                and not self._closed:
            # (a millisecond late rather than early: a deadline is due when it has passed)
            self._timer = self._loop.call_later(delay + 0.001, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._deferred = None
        if self._closed:
            return
        if any(p is not None and _unread(p.transport) for p in self._shards):
            # replies wait in a socket: the loop reads them (on_data) before the deadlines
            # are looked at
            self._deferred = self._loop.call_soon(self._on_timer)
            return
        delay = self._native.on_timer()
        for shard in range(len(self._shards)):
            if (self._shards[shard] is not None or self._connects[shard] is not None) \
                    and self._native.is_down(shard):
                self._drop(shard, "the connection to Redis timed out")
        self._arm(delay)

    def _connect_now(self, shard: int) -> None:
        """A check found ``shard`` down with its circuit closed and waits for a connect:
        made now, not after the back-off."""
        if self._closed:
            return
        r, self._reconnects[shard] = self._reconnects[shard], None
        if r is not None:
            r.cancel()
        if self._shards[shard] is None and self._connects[shard] is None:
            self._connect(shard)
        else:
            self._native.connecting(shard)  # (one is under way: the request is answered)

    def _connect(self, shard: int) -> None:
        if self._closed:
            return
        self._reconnects[shard] = None
        host, port = self._native.address(shard)
        self._native.connecting(shard)
        task = self._loop.create_task(self._open(shard, host, port))
        self._connects[shard] = task
        self._arm(self._native.next_deadline())  # the connect's deadline

    async def _open(self, shard: int, host: str, port: int) -> None:
        me = asyncio.current_task()
        if self._connects[shard] is not me or self._closed:
            return
        # the connect starts now, not when its task was made (a busy loop runs it late):
        # the connect's clock starts with it
        self._native.connecting(shard)
        try:
            await self._loop.create_connection(
                lambda: _Shard(self, shard, self._connects[shard]), host, port)
        except (OSError, asyncio.TimeoutError) as e:
            if self._connects[shard] is not me or self._closed:
                return
            self._connects[shard] = None
            self._native.detach(shard, f"connect to {host}:{port} failed: {e}")
            self._reconnect_later(shard)
        else:
            if self._connects[shard] is me:
                self._connects[shard] = None

    def _made(self, proto: _Shard) -> None:
        shard = proto.shard
        if self._closed or proto.attempt is None or proto.attempt is not self._connects[shard]:
            # closed, or a connect given up meanwhile (its deadline passed)
            assert proto.transport is not None
            proto.transport.abort()
            return
        self._connects[shard] = None
        self._shards[shard] = proto
        self._native.attach(shard, proto.transport)
        self._flush()  # the log-in, and what waited for the connection

    def _data(self, proto: _Shard, data: bytes) -> None:
        shard = proto.shard
        if self._shards[shard] is not proto:
            return
        if self._native.on_data(shard, data):
            self._drop(shard, "a reply from Redis could not be trusted")
        else:
            self._backoff[shard] = 0.0

    def _lost(self, proto: _Shard, exc: Optional[Exception]) -> None:
        shard = proto.shard
        if self._shards[shard] is not proto:
            return
        self._shards[shard] = None
        self._native.detach(
            shard,
            f"the connection to Redis failed: {exc}" if exc is not None
            else "the connection to Redis closed",
        )
        self._reconnect_later(shard)

    def _drop(self, shard: int, why: str) -> None:
        """The machine gave the connection up (bytes it cannot trust, a deadline)."""
        proto, self._shards[shard] = self._shards[shard], None
        task, self._connects[shard] = self._connects[shard], None
        if task is not None:
            task.cancel()
        if proto is not None and proto.transport is not None:
            proto.transport.abort()
        self._native.detach(shard, why)
        self._reconnect_later(shard)

    def _reconnect_later(self, shard: int) -> None:
        if self._closed or self._reconnects[shard] is not None:
            return
        b = min(max(self._backoff[shard] * 2, BACKOFF_MIN), BACKOFF_MAX)
        self._backoff[shard] = b
        # jittered down to half, as the core's own reconnects
        self._reconnects[shard] = self._loop.call_later(
            b / 2 + random.random() * (b / 2), self._connect, shard)

    def close(self) -> None:
        """Closes the sockets; every check in flight fails (and follows ``on_error``)."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        for shard in range(len(self._shards)):
            r = self._reconnects[shard]
            if r is not None:
                r.cancel()
            task = self._connects[shard]
            if task is not None:
                task.cancel()
            proto = self._shards[shard]
            if proto is not None and proto.transport is not None:
                proto.transport.abort()
        self._shards = [None] * len(self._shards)
        self._connects = [None] * len(self._connects)
        self._native.close()

    def abandon(self) -> None:
        """Lets the sockets of a closed loop go (the limiter was used on another loop
        since): the loop cannot close them any more, so their sockets are closed here."""
        self._closed = True
        for proto in self._shards:
            t = proto.transport if proto is not None else None
            sock = getattr(t, "_sock", None)  # asyncio's selector transports
            if sock is not None:
                sock.close()
                t._sock = None  # type: ignore[union-attr]
        self._shards = [None] * len(self._shards)
        self._native.close()
