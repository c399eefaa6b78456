"""asyncio: awaitables resolved by the limiter's own runtime, never blocking the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest
from redis_support import RedisServer, config

import shardlimit
from shardlimit import Limiter, ManualClock

POLICIES = {"api": {"algorithm": "fixed_window", "limit": 3, "window": "1m"}}


def test_acheck_on_redis(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES))

    async def main() -> list[shardlimit.Decision]:
        return [await limiter.acheck("k", "api") for _ in range(4)]

    ds = asyncio.run(main())
    assert [d.allowed for d in ds] == [True, True, True, False]
    assert [d.remaining for d in ds] == [2, 1, 0, 0]
    assert ds[-1].retry_after is not None and 0 < ds[-1].retry_after <= 60
    assert all(d.source == "redis" for d in ds)


def test_acheck_on_memory_completes_at_once() -> None:
    clock = ManualClock(1_800_000_000_000_000)
    limiter = Limiter.from_json('{"policies": {"api": {"algorithm": "fixed_window", '
                                '"limit": 1, "window": "1s"}}}', clock=clock)

    async def main() -> tuple[bool, bool, bool]:
        first = await limiter.acheck("k", "api")
        second = await limiter.acheck("k", "api")
        clock.advance_us(1_000_000)
        third = await limiter.acheck("k", "api")
        return first.allowed, second.allowed, third.allowed

    assert asyncio.run(main()) == (True, False, True)


def test_the_loop_runs_while_redis_is_paused(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES, timeout_ms=5000))

    async def main() -> None:
        assert (await limiter.acheck("k", "api")).allowed  # connected
        assert redis.command("CLIENT", "PAUSE", 300, "ALL") == "OK"
        pending = asyncio.ensure_future(limiter.acheck("k", "api"))
        # the call returned at once: Redis cannot have answered while paused
        assert not pending.done()
        ticks = 0
        while not pending.done():
            ticks += 1
            await asyncio.sleep(0.01)
        assert ticks > 1, "the event loop kept running during the call"
        assert (await pending).remaining == 1

    asyncio.run(main())


def test_a_cancelled_call_leaves_the_loop_healthy(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES, timeout_ms=5000))

    async def main() -> None:
        assert (await limiter.acheck("k", "api")).allowed
        assert redis.command("CLIENT", "PAUSE", 200, "ALL") == "OK"
        fut = asyncio.ensure_future(limiter.acheck("k", "api"))
        await asyncio.sleep(0)
        fut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fut
        # the cancelled check still ran in Redis (a rate limiter cannot un-send it)
        d = await limiter.acheck("k", "api")
        assert d.remaining == 0 and d.allowed

    asyncio.run(main())


def test_one_limiter_on_loops_in_several_threads(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], {
        "big": {"algorithm": "sliding_log", "limit": 400, "window": "1h"}}))
    results: list[int] = []
    lock = threading.Lock()

    def thread() -> None:
        async def main() -> int:
            ds = await asyncio.gather(*(limiter.acheck("k", "big") for _ in range(100)))
            return sum(d.allowed for d in ds)

        n = asyncio.run(main())
        with lock:
            results.append(n)

    threads = [threading.Thread(target=thread) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [100, 100, 100, 100]
    assert limiter.peek("k", "big").remaining == 0


def test_successive_event_loops(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES))

    async def one() -> int:
        return (await limiter.acheck("k", "api")).remaining

    assert [asyncio.run(one()) for _ in range(3)] == [2, 1, 0]
