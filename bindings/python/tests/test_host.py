"""The host transport (``transport="host"``): ``acheck``'s bytes move on the asyncio loop
itself (``shardlimit/_host.py`` over the core's ``HostChecks``). The same decisions as
the default path (the vectors replayed through it), deadlines, Redis killed mid-flight,
reconnects, a hostile server, closing with checks in flight, and uvloop when installed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest
import test_vectors
from redis_support import RedisServer, config

import shardlimit
import shardlimit._host as host_module
from shardlimit import Limiter, ManualClock

POLICIES = {
    "api": {"algorithm": "fixed_window", "limit": 3, "window": "1m"},
    "open": {"algorithm": "fixed_window", "limit": 3, "window": "1m", "on_error": "open"},
    "raising": {"algorithm": "fixed_window", "limit": 3, "window": "1m", "on_error": "error"},
}


class Counted(host_module.HostTransport):
    """The driver, counting the chunks it read: proof that the replies came this way."""

    made: list[Counted] = []

    def __init__(self, native: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.chunks = 0
        Counted.made.append(self)
        super().__init__(native, loop)

    def _data(self, proto: Any, data: bytes) -> None:
        self.chunks += 1
        super()._data(proto, data)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Counted]]:
    monkeypatch.setattr(host_module, "HostTransport", Counted)
    Counted.made = []
    yield Counted


def host_limiter(servers: list[RedisServer], **extra: Any) -> Limiter:
    return Limiter.from_json(config(servers, POLICIES, **extra), transport="host")


def test_the_vectors_replay_through_the_host_transport(redis: RedisServer,
                                                       counted: type[Counted]) -> None:
    made: list[Limiter] = []

    def make(case: dict[str, Any], clock: ManualClock) -> Limiter:
        # a fresh key space per case, like the core's FLUSHALL
        text = config([redis], case["policies"], key_prefix=f"host{len(made)}:",
                      **test_vectors.extra(case))
        made.append(Limiter.from_json(text, clock=clock, transport="host"))
        return made[-1]

    async def main() -> int:
        try:
            return await test_vectors.replay_async(make, "redis")
        finally:
            for limiter in made:
                limiter.close()

    assert asyncio.run(main()) == test_vectors.total_steps()
    assert sum(d.chunks for d in counted.made) > 0, "no reply came through the host transport"


def test_decisions_equal_the_thread_path(redis: RedisServer, counted: type[Counted]) -> None:
    default = Limiter.from_json(config([redis], POLICIES, key_prefix="d:"), transport="thread")
    hosted = Limiter.from_json(config([redis], POLICIES, key_prefix="h:"), transport="host")

    async def main(limiter: Limiter) -> list[tuple[bool, int, str]]:
        # a burst (one batch) and then one at a time
        ds = await asyncio.gather(*[limiter.acheck(f"k{i % 3}", "api") for i in range(10)])
        ds += [await limiter.acheck("k0", "api", 2) for _ in range(2)]
        limiter.close()
        return [(d.allowed, d.remaining, d.source) for d in ds]

    assert asyncio.run(main(hosted)) == asyncio.run(main(default))
    assert counted.made and counted.made[0].chunks > 0


def test_what_the_core_delegates_takes_the_default_path(redis: RedisServer,
                                                        counted: type[Counted]) -> None:
    limiter = host_limiter([redis])

    async def main() -> list[bool]:
        layered = await limiter.acheck("k", "2/second; 100/minute")
        shadow = await limiter.acheck_shadow("k", "api")
        plain = await limiter.acheck("k", "api")
        return [layered.allowed, shadow.allowed, plain.allowed]

    assert asyncio.run(main()) == [True, True, True]

    async def again() -> int:
        # a second loop (the first one closed) starts a transport of its own
        try:
            return (await limiter.acheck("k", "api")).remaining
        finally:
            limiter.close()

    assert asyncio.run(again()) == 0
    assert len(counted.made) == 2 and counted.made[1].chunks > 0


def test_bad_transport_and_non_tcp_engines_are_refused(redis: RedisServer) -> None:
    with pytest.raises(shardlimit.InvalidArgumentError, match="transport"):
        Limiter.from_json(config([redis], POLICIES), transport="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(shardlimit.ConfigError, match="in memory"):
        Limiter.from_json(json.dumps({"policies": POLICIES}), transport="host")


def test_the_default_is_the_host_transport_where_it_serves_the_shards(
        redis: RedisServer) -> None:
    """No option: the host transport on plain TCP shards, the I/O thread where it cannot
    serve them (in memory here; TLS, Sentinel, Cluster, Unix sockets alike), never an
    error; ``transport="thread"`` keeps the I/O thread."""
    text = config([redis], POLICIES)
    for made, want in [(Limiter.from_json(text), "host"),
                       (Limiter.from_json(text, transport="default"), "host"),
                       (Limiter.from_json(text, transport="thread"), "thread"),
                       (Limiter.from_json(text, transport="host"), "host"),
                       (Limiter.from_json(json.dumps({"policies": POLICIES})), "thread"),
                       (Limiter.memory(), "thread")]:
        assert made.transport == want
        made.close()


@pytest.fixture
def stopped(redis: RedisServer) -> Iterator[RedisServer]:
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        yield redis
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)


def test_deadline_of_a_check_in_flight(redis: RedisServer) -> None:
    limiter = host_limiter([redis], timeout_ms=200)

    async def main() -> tuple[shardlimit.Decision, Optional[BaseException], float]:
        assert (await limiter.acheck("warm", "api")).source == "redis"  # connected
        assert redis.proc is not None
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            t = time.monotonic()
            results = await asyncio.gather(
                limiter.acheck("k", "open"), limiter.acheck("k", "raising"),
                return_exceptions=True)
            took = time.monotonic() - t
            opened, raised = results
            assert isinstance(opened, shardlimit.Decision)
            assert not isinstance(raised, shardlimit.Decision)
            return opened, raised, took
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
            limiter.close()

    opened, raised, took = asyncio.run(main())
    assert opened.allowed and opened.source == "fallback"
    assert isinstance(raised, shardlimit.TimeoutError), raised
    assert 0.19 <= took < 2.0, took


def test_redis_killed_mid_flight_follows_on_error(counted: type[Counted]) -> None:
    server = RedisServer()
    try:
        limiter = host_limiter([server])

        async def main() -> list[Any]:
            assert (await limiter.acheck("warm", "api")).source == "redis"
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)
            calls = [asyncio.ensure_future(limiter.acheck(f"k{i}", p))
                     for i in range(20) for p in ("open", "raising")]
            while counted.made[0]._native.in_flight < len(calls):
                await asyncio.sleep(0)
            await asyncio.sleep(0)  # (the burst's write)
            server.proc.kill()  # the checks are on the socket of a server that dies
            server.proc.wait(timeout=10)
            try:
                return await asyncio.gather(*calls, return_exceptions=True)
            finally:
                limiter.close()

        rs = asyncio.run(asyncio.wait_for(main(), 10))
        opened, raised = rs[0::2], rs[1::2]
        assert all(isinstance(d, shardlimit.Decision) and d.allowed and d.source == "fallback"
                   for d in opened), opened
        assert all(isinstance(e, shardlimit.BackendError) for e in raised), raised
        assert not any(isinstance(e, shardlimit.TimeoutError) for e in raised), \
            "failed by the closed socket, not by the deadline"
    finally:
        server.stop()


def test_reconnects_after_the_server_closes_the_connection(redis: RedisServer,
                                                           counted: type[Counted]) -> None:
    limiter = host_limiter([redis])

    async def main() -> list[str]:
        sources = [(await limiter.acheck("k", "open")).source]
        killed = redis.command("CLIENT", "KILL", "TYPE", "normal")
        assert killed >= 1
        # until the transport has connected again (bounded: 5 s): meanwhile a check
        # follows on_error at once, as nobody is connected
        deadline = time.monotonic() + 5
        while counted.made[0]._shards[0] is None or sources[-1] != "redis":
            assert time.monotonic() < deadline, "no reconnect within 5 s"
            await asyncio.sleep(0.005)
            sources.append((await limiter.acheck("k", "open")).source)
        limiter.close()
        return sources

    sources = asyncio.run(main())
    assert sources[0] == "redis" and sources[-1] == "redis"
    assert set(sources) <= {"redis", "fallback"}


async def hostile_server(reply: bytes) -> tuple[asyncio.AbstractServer, int, list[bool]]:
    """A fake Redis on 127.0.0.1 answering every read with ``reply``; the list records
    whether each connection was closed by the client."""
    closed: list[bool] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while await r.read(65536):
            w.write(reply)
        closed.append(True)
        w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], closed


@pytest.mark.parametrize("reply", [b"$-5\r\n", b":1\r\n:2\r\n:3\r\n", b"*99999999999\r\n"])
def test_a_hostile_reply_fails_the_checks_and_drops_the_socket(reply: bytes) -> None:
    async def main() -> tuple[Any, Any, list[bool]]:
        server, port, closed = await hostile_server(reply)
        text = json.dumps({"shards": [{"name": "fake", "url": f"redis://127.0.0.1:{port}"}],
                           "timeout_ms": 2000, "policies": POLICIES})
        limiter = Limiter.from_json(text, transport="host")
        try:
            r = await asyncio.gather(limiter.acheck("k", "raising"), limiter.acheck("k", "open"),
                                     return_exceptions=True)
            deadline = time.monotonic() + 5
            while not closed:  # the client dropped the connection it cannot trust
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            return r[0], r[1], closed
        finally:
            limiter.close()
            server.close()

    raised, opened, closed = asyncio.run(asyncio.wait_for(main(), 10))
    assert isinstance(raised, shardlimit.BackendError), raised
    assert not isinstance(raised, shardlimit.TimeoutError), "failed on the bytes, not the clock"
    assert isinstance(opened, shardlimit.Decision) and opened.source == "fallback"
    assert closed


def test_closing_with_checks_in_flight(stopped: RedisServer) -> None:
    limiter = host_limiter([stopped])

    async def main() -> tuple[list[Any], Optional[BaseException]]:
        calls = [asyncio.ensure_future(limiter.acheck(f"k{i}", p))
                 for i in range(5) for p in ("open", "raising")]
        await asyncio.sleep(0)  # started (their checks queued on the connecting socket)
        limiter.close()
        done = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 2)
        try:
            await limiter.acheck("k", "api")
        except shardlimit.InvalidArgumentError as e:
            return done, e
        return done, None

    done, after = asyncio.run(main())
    assert all(isinstance(d, shardlimit.Decision) and d.source == "fallback" for d in done[0::2])
    assert all(isinstance(e, shardlimit.BackendError) for e in done[1::2]), done
    assert after is not None and "closed" in str(after)


def test_uvloop(redis: RedisServer, counted: type[Counted]) -> None:
    uvloop = pytest.importorskip("uvloop")
    limiter = host_limiter([redis])

    async def main() -> list[int]:
        ds = await asyncio.gather(*[limiter.acheck("k", "api") for _ in range(4)])
        limiter.close()
        return sorted(d.remaining for d in ds)

    run: Callable[[Any], list[int]] = uvloop.run
    assert run(main()) == [0, 0, 1, 2]
    assert counted.made[0].chunks > 0


def test_redis_is_used_again_within_500_ms_of_a_restart(counted: type[Counted]) -> None:
    """Killed, then restarted on its port after an outage long enough (1.5 s, a check every
    10 ms) that the circuit is open and every back-off at its longest: the checks decide on
    Redis again within 500 ms, counted from before the new server is spawned (its own
    start-up is in it)."""
    first = RedisServer()
    port = first.port
    limiter = Limiter.from_json(config([first], POLICIES, timeout_ms=300), transport="host")
    restarted: Optional[Any] = None

    async def main() -> float:
        nonlocal restarted
        assert (await limiter.acheck("k", "open")).source == "redis"
        assert first.proc is not None
        first.proc.kill()
        first.proc.wait(timeout=10)
        first.proc = None
        outage = time.monotonic() + 1.5
        while time.monotonic() < outage:
            assert (await limiter.acheck("k", "open")).source == "fallback"
            await asyncio.sleep(0.01)
        spawned = time.monotonic()
        restarted = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL)
        until = spawned + 5
        while True:
            d = await limiter.acheck("fresh", "open")
            if d.source == "redis":
                assert d.remaining == 2
                return time.monotonic() - spawned
            assert time.monotonic() < until, "never reconnected after a restart"
            await asyncio.sleep(0.005)

    try:
        took = asyncio.run(main())
        assert took < 0.5, f"Redis was used again {took * 1000:.0f} ms after its restart"
    finally:
        limiter.close()
        if restarted is not None:
            restarted.terminate()
            restarted.wait(timeout=10)
        first.stop()


def test_a_late_timer_on_a_busy_loop_does_not_fail_replies_in_the_socket(
        redis: RedisServer) -> None:
    """The deadline (50 ms, the default) is the shard's silence: the loop is blocked for
    300 ms right after the checks are written and Redis answers meanwhile; the timer is due
    when the loop wakes, and the replies in the socket are read before it is looked at."""
    limiter = Limiter.from_json(config([redis], POLICIES, timeout_ms=50, key_prefix="busy:"),
                                transport="host")

    async def main() -> list[str]:
        assert (await limiter.acheck("warm", "open")).source == "redis"
        sources: list[str] = []
        for round in range(3):
            calls = [asyncio.ensure_future(limiter.acheck(f"b{round}-{i}", "open"))
                     for i in range(32)]
            await asyncio.sleep(0)  # the checks are made and written
            await asyncio.sleep(0)
            time.sleep(0.3)  # this process is slow, Redis is not
            sources += [d.source for d in await asyncio.gather(*calls)]
        return sources

    try:
        sources = asyncio.run(main())
    finally:
        limiter.close()
    assert sources == ["redis"] * 96, f"{sources.count('fallback')} of 96 fell back"


def test_a_deadline_waits_for_replies_the_loop_has_not_read(redis: RedisServer,
                                                            counted: type[Counted]) -> None:
    """The test above cannot fail on asyncio's own loop, which reads the sockets before it
    runs the timers that are due (uvloop runs them first). Here the loop does not read the
    shard's socket (``pause_reading``) while the replies come and three deadlines (50 ms)
    pass: the timer asks the socket (FIONREAD) and waits; once the loop reads again, Redis
    decides every check. Without that question every check would fall back at 50 ms."""
    limiter = Limiter.from_json(config([redis], POLICIES, timeout_ms=50, key_prefix="unread:"),
                                transport="host")

    async def main() -> list[str]:
        assert (await limiter.acheck("warm", "open")).source == "redis"
        proto = counted.made[0]._shards[0]
        assert proto is not None and proto.transport is not None
        transport: Any = proto.transport
        transport.pause_reading()
        calls = [asyncio.ensure_future(limiter.acheck(f"u{i}", "open")) for i in range(32)]
        until = time.monotonic() + 5
        while not host_module._unread(transport):
            assert time.monotonic() < until, "no reply came"
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.15)
        assert not any(c.done() for c in calls), "a check ended while its reply was unread"
        transport.resume_reading()
        return [d.source for d in await asyncio.gather(*calls)]

    try:
        sources = asyncio.run(main())
    finally:
        limiter.close()
    assert sources == ["redis"] * 32, f"{sources.count('fallback')} of 32 fell back"


@pytest.mark.parametrize("head,unit", [(b"+", b"x"), (b"*200000\r\n", b":1111111\r\n")],
                         ids=["a line that never ends", "an array that grows past 1 MiB"])
def test_an_endless_reply_is_dropped_at_the_bound(head: bytes, unit: bytes) -> None:
    """The reply bounds hold on the host transport: a server whose reply never ends fails
    the check at the bound (1 MiB a check reply), not at the deadline, and is dropped
    having sent a bounded amount (what the sockets' buffers hold besides)."""
    async def main() -> tuple[Any, list[int]]:
        sent: list[int] = []

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            if await r.read(65536):
                chunk = unit * (65536 // len(unit))
                total = 0
                try:
                    w.write(head)
                    while total < 1 << 30:  # the client drops it long before
                        w.write(chunk)
                        total += len(chunk)
                        await w.drain()
                except (ConnectionError, OSError):
                    pass
                sent.append(total)
            w.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        text = json.dumps({"shards": [{"name": "fake", "url": f"redis://127.0.0.1:{port}"}],
                           "timeout_ms": 5000, "policies": POLICIES})
        limiter = Limiter.from_json(text, transport="host")
        try:
            r = await asyncio.gather(limiter.acheck("k", "raising"), return_exceptions=True)
            deadline = time.monotonic() + 5
            while not sent:
                assert time.monotonic() < deadline, "the endless reply was never dropped"
                await asyncio.sleep(0.005)
            return r[0], sent
        finally:
            limiter.close()
            server.close()

    started = time.monotonic()
    raised, sent = asyncio.run(asyncio.wait_for(main(), 15))
    assert isinstance(raised, shardlimit.BackendError), raised
    assert not isinstance(raised, shardlimit.TimeoutError), "failed on the clock, not the bound"
    assert time.monotonic() - started < 4
    assert sent[0] < 32 << 20, f"the server wrote {sent[0] >> 20} MiB before the drop"


@pytest.mark.parametrize("transport", ["thread", "host"])
def test_20000_concurrent_achecks_admit_exactly_the_limit(redis: RedisServer,
                                                         transport: str) -> None:
    """Redis healthy, the default timeout (50 ms) and on_error (open): the time a check
    waits in this process (the loop working through 20,000 tasks) is not Redis being
    slow, so none falls back and exactly the limit is admitted."""
    import overload_shapes

    r = overload_shapes.concurrent_achecks(redis.url, transport, n=20_000, limit=1000)
    assert (r["admitted"], r["fallbacks"], r["errors"]) == (1000, 0, 0), r
